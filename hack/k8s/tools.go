//go:build tools

// Package tools names the kubernetes commands this wrapper module builds, so `go mod tidy` keeps
// every module they import. k8s.io/kubernetes cannot be built on its own from the module proxy: its
// go.mod requires its staging modules at v0.0.0 and replaces them with paths inside its own tree,
// so this module replaces each one with its published v0.X.Y (see go.mod, written by build.sh pin).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
