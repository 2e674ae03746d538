// etcd for the kind tier's locally built node image. etcd's own main module
// carries replace directives, so `go install` refuses it; this one-line
// wrapper builds the same server from the published server module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
