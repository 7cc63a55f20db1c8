// Command etcd is etcd's own server main, built from go.etcd.io/etcd/server/v3 at the version that
// hack/k8s/versions.env pins (the upstream binary is the same call in go.etcd.io/etcd's server/main.go).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
