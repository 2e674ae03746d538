module modelplane.local/runc-shim

go 1.22
