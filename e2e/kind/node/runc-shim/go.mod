module hotset.local/runc-shim

go 1.22
