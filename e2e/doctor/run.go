package doctor

import (
	"context"
	"time"

	"k8s.io/client-go/kubernetes"
)

const defaultAPITimeout = 10 * time.Second

// Run collects the evidence o points at and evaluates every layer. The
// error is only for a cancelled context; unreadable inputs become
// "unknown" verdicts.
func Run(ctx context.Context, o Options) (Report, error) {
	o = o.withDefaults()
	e := Collect(ctx, o)
	if err := ctx.Err(); err != nil {
		return Report{}, err
	}
	return Report{Node: e.Node, Time: o.Now().UTC(), Verdicts: Evaluate(e), Evidence: e}, nil
}

// Collect reads every input o names.
func Collect(ctx context.Context, o Options) Evidence {
	o = o.withDefaults()
	log := o.Logger
	e := Evidence{Node: o.Node, Resource: o.Resource, RuntimeClass: o.RuntimeClass}
	if o.Remote {
		const why = "not on the worker (--remote)"
		e.SMI = SMIEvidence{Path: o.NvidiaSMI, Unread: why}
		e.KubeletDir = KubeletDirEvidence{Dir: o.KubeletDir, Unread: why}
		e.Plugin = PluginEvidence{URL: o.DevicePluginMetrics, Unread: why}
		e.NRI = NRIEvidence{URL: o.NRIMetrics, MetricsUnread: why}
		e.Containerd = ContainerdEvidence{Path: o.ContainerdConfig, Unread: why}
	} else {
		e.SMI = collectSMI(ctx, o.NvidiaSMI)
		e.KubeletDir = collectKubeletDir(o.KubeletDir)
		e.Plugin = collectPlugin(ctx, o)
		collectNRIMetrics(ctx, o, &e.NRI)
		e.Containerd = collectContainerd(o.ContainerdConfig)
	}

	client, kubeErr := kubeClient(o)
	if kubeErr == "" {
		node, err := resolveNode(ctx, client, o.Node, o.Resource)
		if err != nil {
			kubeErr = err.Error()
		} else {
			e.Node = node
		}
	}
	if kubeErr != "" {
		log.Warn("doctor: no cluster evidence", "why", kubeErr)
		e.NodeStatus.Unread, e.Selected.Unread, e.Ledger.Unread, e.Allocate.Unread = kubeErr, kubeErr, kubeErr, kubeErr
		e.RuntimeCls.Unread, e.NRI.ErrorsUnread, e.App.Unread = kubeErr, kubeErr, kubeErr
		e.App.Selector = o.PodSelector
	} else {
		e.NodeStatus = collectNode(ctx, client, e.Node, o.Resource)
		e.Selected = collectSelected(ctx, client, o)
		kf := collectPods(ctx, client, e.Node, o.Resource)
		e.Ledger, e.Allocate, e.NRI.CreateErrors = kf.ledger, kf.allocate, kf.create
		if kf.err != "" {
			e.Ledger.Unread, e.Allocate.Unread, e.NRI.ErrorsUnread = kf.err, kf.err, kf.err
		}
		e.RuntimeCls = collectRuntimeClass(ctx, client, o.RuntimeClass)
		e.App = collectApp(ctx, client, o)
	}
	if o.Remote {
		e.CDI = CDIEvidence{Dirs: o.CDISpecDirs, Wanted: wantedNames(e, o.CDIKind), Unread: "not on the worker (--remote)"}
	} else {
		e.CDI = collectCDI(o.CDISpecDirs, wantedNames(e, o.CDIKind))
	}
	log.Debug("doctor: evidence collected", "node", e.Node)
	return e
}

func kubeClient(o Options) (kubernetes.Interface, string) {
	switch {
	case o.Client != nil:
		return o.Client, ""
	case o.NoKube:
		return nil, "the API server is not consulted (--no-kube)"
	}
	c, err := Client(o.Kubeconfig)
	if err != nil {
		return nil, err.Error()
	}
	return c, ""
}
