package collect

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/podresources"
)

// podResourcesTimeout bounds the one List: kubelet answers a local call at
// once or not at all.
const podResourcesTimeout = 5 * time.Second

// collectPodResources asks kubelet's PodResources socket which container
// holds which devices.
func collectPodResources(ctx context.Context, socket string) evidence.PodResourcesEvidence {
	ev := evidence.PodResourcesEvidence{Socket: socket}
	c, err := podresources.Dial(socket, podresources.WithTimeout(podResourcesTimeout))
	if err != nil {
		ev.Unread = fmt.Sprintf("connect to kubelet's PodResources socket %s (pass --pod-resources-socket): %v", socket, err)
		return ev
	}
	defer c.Close()
	return listPodResources(ctx, c, ev)
}

// listPodResources fills ev from c's List: each container's device-plugin
// devices, by resource.
func listPodResources(ctx context.Context, c *podresources.Client, ev evidence.PodResourcesEvidence) evidence.PodResourcesEvidence {
	pods, err := c.List(ctx)
	if err != nil {
		ev.Unread = fmt.Sprintf("%v (the doctor reads it as root on the worker)", err)
		return ev
	}
	for _, p := range pods {
		for _, ctr := range p.Containers {
			ref := evidence.PodRef{Namespace: p.Namespace, Name: p.Name, Container: ctr.Name}
			for _, d := range ctr.Devices {
				ev.Containers = append(ev.Containers, evidence.ContainerDevices{PodRef: ref, Resource: d.Resource, IDs: slices.Clone(d.IDs)})
			}
		}
	}
	slices.SortFunc(ev.Containers, func(a, b evidence.ContainerDevices) int {
		return strings.Compare(a.String()+" "+a.Resource, b.String()+" "+b.Resource)
	})
	return ev
}
