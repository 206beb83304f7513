// Command etcd is etcd's server main, built from the same pinned module graph as the
// Kubernetes binaries so the node needs no separately installed etcd.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
