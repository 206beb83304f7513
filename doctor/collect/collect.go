// Package collect reads the doctor's evidence: every file, socket, command,
// metrics endpoint and API request is made here, as Options say, and each
// fills a part of an evidence value whose Unread says why it could not be
// read. Of the doctor it imports evidence and its I/O helpers only, never
// check or render, so what a check judges is all in the evidence.
package collect

import (
	"context"

	"k8s.io/client-go/kubernetes"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
)

// Node reads every input o names about the node. The API server comes
// first: it says where the daemons' pods (and so their metrics) are.
func Node(ctx context.Context, o Options) evidence.Evidence {
	o = o.WithDefaults()
	log := o.Logger
	e := evidence.Evidence{Node: o.Node, Resource: o.Resource, RuntimeClass: o.RuntimeClass}

	client, exec, kubeErr := kubeClient(o)
	if o.Exec == nil {
		o.Exec = exec
	}
	if kubeErr == "" {
		node, err := resolveNode(ctx, client, o.Node, o.Resource)
		if err != nil {
			kubeErr = err.Error()
		} else {
			e.Node = node
		}
	}
	if kubeErr != "" {
		log.Warn("no cluster evidence", "why", kubeErr)
		e.NodeStatus.Unread, e.Selected.Unread, e.Ledger.Unread, e.Allocate.Unread = kubeErr, kubeErr, kubeErr, kubeErr
		e.RuntimeCls.Unread, e.NRI.ErrorsUnread, e.App.Unread = kubeErr, kubeErr, kubeErr
		e.PluginPod = evidence.DaemonEvidence{App: contract.DevicePluginApp, Namespace: o.DaemonNamespace, Unread: kubeErr}
		e.NRIPod = evidence.DaemonEvidence{App: contract.NRIApp, Namespace: o.DaemonNamespace, Unread: kubeErr}
		e.DRAPod = evidence.DaemonEvidence{App: contract.DRAApp, Namespace: o.DaemonNamespace, Unread: kubeErr}
		e.App.Selector = appSelector(o)
	} else {
		e.NodeStatus = nodeStatus(ctx, client, e.Node, o.Resource)
		e.Selected = collectSelected(ctx, client, o)
		kf := collectPods(ctx, client, e.Node, o.Resource)
		e.Ledger, e.Allocate, e.NRI.CreateErrors = kf.ledger, kf.allocate, kf.create
		if kf.err != "" {
			e.Ledger.Unread, e.Allocate.Unread, e.NRI.ErrorsUnread = kf.err, kf.err, kf.err
		}
		e.RuntimeCls = collectRuntimeClass(ctx, client, o.RuntimeClass)
		e.PluginPod = collectDaemon(ctx, client, o.DaemonNamespace, contract.DevicePluginApp, e.Node, contract.DevicePluginMetricsPort)
		e.NRIPod = collectDaemon(ctx, client, o.DaemonNamespace, contract.NRIApp, e.Node, contract.NRIMetricsPort)
		e.DRAPod = collectDaemon(ctx, client, o.DaemonNamespace, contract.DRAApp, e.Node, contract.DRAMetricsPort)
	}
	e.Mode = detectMode(o.Mode, e.NodeStatus, e.PluginPod, e.DRAPod)
	if e.Mode.Mode == contract.DRAModeDRA {
		e.DRA = collectDRA(ctx, client, e.Node, o, e.DRAPod)
	}
	if kubeErr == "" {
		e.App = collectApp(ctx, client, e.Node, o, e.DRA)
	}
	o.DevicePluginMetrics = metricsURL(o.DevicePluginMetrics, e.PluginPod)
	o.NRIMetrics = metricsURL(o.NRIMetrics, e.NRIPod)

	if o.Remote {
		const why = "not on the worker (--remote)"
		e.SMI = evidence.SMIEvidence{Path: o.NvidiaSMI, Unread: why}
		e.KubeletDir = evidence.KubeletDirEvidence{Dir: o.KubeletDir, Unread: why}
		e.Containerd = evidence.ContainerdEvidence{Path: o.ContainerdConfig, Unread: why}
		e.PodResources = evidence.PodResourcesEvidence{Socket: o.PodResourcesSocket, Unread: why}
	} else {
		e.SMI = collectSMI(ctx, o.NvidiaSMI)
		e.KubeletDir = collectKubeletDir(o.KubeletDir)
		e.Containerd = collectContainerd(o.ContainerdConfig)
		e.PodResources = collectPodResources(ctx, o.PodResourcesSocket)
	}
	// Metrics are read over the pod network, so --remote does not stop them.
	e.Plugin = collectPlugin(ctx, o, e.PluginPod)
	collectNRIMetrics(ctx, o, e.NRIPod, &e.NRI)

	kind := contract.CDIKind(o.CDIVendor, o.CDIClass)
	if o.Remote {
		const why = "not on the worker (--remote)"
		e.CDI = evidence.CDIEvidence{Dirs: o.CDISpecDirs, Wanted: wantedNames(e, kind), Unread: why, RuntimeUnread: why}
		e.DriverRoot = evidence.DriverRootEvidence{Root: o.DriverRoot, Unread: why}
	} else {
		e.CDI = collectCDI(o.CDISpecDirs, wantedNames(e, kind), kind)
		dialMPS(e.CDI.GPUDevices)
		owner := e.SpecOwner()
		collectRuntimeSpecs(&e.CDI, runtimeDirs(e.Containerd, o.CDISpecDirs), ownSpecPath(owner, o.CDIVendor, o.CDIClass))
		e.DriverRoot = collectDriverRoot(o.DriverRoot, owner)
	}
	log.Debug("evidence collected", "node", e.Node)
	return e
}

// metricsURL is the URL given, else the one found from the daemon's pod.
func metricsURL(given string, d evidence.DaemonEvidence) string {
	if given != "" {
		return given
	}
	return d.MetricsURL
}

func kubeClient(o Options) (kubernetes.Interface, ExecFunc, string) {
	switch {
	case o.Client != nil:
		return o.Client, nil, ""
	case o.NoKube:
		return nil, nil, "the API server is not consulted (--no-kube)"
	}
	c, exec, err := clientAndExec(o.Kubeconfig)
	if err != nil {
		return nil, nil, err.Error()
	}
	return c, exec, ""
}
