// Package kubeclient is how nvinject's node programs (nvinject-dra,
// nvinject-nri) reach the API server: the client-go REST config from
// --kubeconfig, else from the pod's service account. Each builds only the
// typed clients it needs on the config (nvinject-nri only core/v1, which
// keeps its binary small), so this package imports client-go's rest and
// clientcmd and no clientset.
package kubeclient

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nvinject/nvinject/shared/contract"
)

// Config is the REST config from kubeconfig, or from the pod's service
// account when kubeconfig is empty, with program as its user agent.
// program is also the service account's name (nvinject's DaemonSets name
// their accounts after the program) in the advice of the error.
func Config(kubeconfig, program string) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("API server configuration (--kubeconfig=%s): %w; give a kubeconfig, or run in a pod with the %s service account (a node without kube-proxy: set KUBERNETES_SERVICE_HOST/PORT to the API server's address)", contract.Quote(kubeconfig), err, program)
	}
	cfg.UserAgent = program
	return cfg, nil
}
