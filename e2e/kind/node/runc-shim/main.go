// hotset-runc: an OCI runtime wrapper for hosts whose capability bounding
// set lacks CAP_SYS_RESOURCE (test infrastructure for the kind tier only).
//
// A privileged container asks runc for every capability; runc then fails with
// "unable to apply caps: operation not permitted" where the host itself lacks
// one. This wrapper removes CAP_SYS_RESOURCE from the container's spec
// (config.json for create/run, the process file for exec) and hands
// everything else to the real runc unchanged. dockerd runs kind's node
// containers through it, and containerd inside each node runs pods through it.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

const dropped = "CAP_SYS_RESOURCE"

// globalWithValue are runc's global flags that take a separate value.
var globalWithValue = map[string]bool{"--root": true, "--log": true, "--log-format": true, "--criu": true, "--rootless": true}

func main() {
	args := os.Args[1:]
	if err := rewrite(args); err != nil {
		fmt.Fprintf(os.Stderr, "hotset-runc: %v\n", err)
		os.Exit(1)
	}
	real, err := realRunc()
	if err != nil {
		fmt.Fprintf(os.Stderr, "hotset-runc: %v\n", err)
		os.Exit(1)
	}
	err = syscall.Exec(real, append([]string{real}, filterCapFlags(args)...), os.Environ())
	fmt.Fprintf(os.Stderr, "hotset-runc: exec %s: %v\n", real, err)
	os.Exit(1)
}

// rewrite strips the capability from the spec file the subcommand will read.
func rewrite(args []string) error {
	i := subcommandIndex(args)
	if i < 0 {
		return nil
	}
	rest := args[i+1:]
	switch args[i] {
	case "create", "run":
		bundle := flagValue(rest, "--bundle", "-b")
		if bundle == "" {
			bundle = "."
		}
		return editJSON(filepath.Join(bundle, "config.json"), func(spec map[string]any) {
			if process, ok := spec["process"].(map[string]any); ok {
				dropCap(process)
			}
		})
	case "exec":
		if path := flagValue(rest, "--process", "-p"); path != "" {
			return editJSON(path, dropCap)
		}
	}
	return nil
}

func subcommandIndex(args []string) int {
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if !strings.HasPrefix(arg, "-") {
			return i
		}
		if globalWithValue[arg] {
			i++
		}
	}
	return -1
}

func flagValue(args []string, names ...string) string {
	for i, arg := range args {
		for _, name := range names {
			if arg == name && i+1 < len(args) {
				return args[i+1]
			}
			if strings.HasPrefix(arg, name+"=") {
				return strings.TrimPrefix(arg, name+"=")
			}
		}
	}
	return ""
}

// filterCapFlags removes `--cap CAP_SYS_RESOURCE` from an exec command line.
func filterCapFlags(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		if (args[i] == "--cap" || args[i] == "-c") && i+1 < len(args) && args[i+1] == dropped {
			i++
			continue
		}
		if args[i] == "--cap="+dropped {
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// dropCap removes the capability from every set of an OCI process object.
func dropCap(process map[string]any) {
	caps, ok := process["capabilities"].(map[string]any)
	if !ok {
		return
	}
	for set, value := range caps {
		list, ok := value.([]any)
		if !ok {
			continue
		}
		kept := make([]any, 0, len(list))
		for _, c := range list {
			if c != dropped {
				kept = append(kept, c)
			}
		}
		caps[set] = kept
	}
}

func editJSON(path string, edit func(map[string]any)) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	decoder := json.NewDecoder(bytes.NewReader(raw))
	decoder.UseNumber()
	var doc map[string]any
	if err := decoder.Decode(&doc); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	edit(doc)
	out, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, info.Mode().Perm())
}

// realRunc is HOTSET_REAL_RUNC, else the first runc on the usual paths that is not this program.
func realRunc() (string, error) {
	if path := os.Getenv("HOTSET_REAL_RUNC"); path != "" {
		return path, nil
	}
	self, _ := os.Executable()
	for _, candidate := range []string{"/usr/local/sbin/runc", "/usr/sbin/runc", "/usr/bin/runc", "/usr/local/bin/runc"} {
		if resolved, err := filepath.EvalSymlinks(candidate); err == nil && resolved != self {
			if info, err := os.Stat(resolved); err == nil && !info.IsDir() {
				return resolved, nil
			}
		}
	}
	return "", fmt.Errorf("no runc found (set HOTSET_REAL_RUNC)")
}
