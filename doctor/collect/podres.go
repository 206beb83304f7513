package collect

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nvinject/nvinject/doctor/evidence"
)

// podResourcesTimeout bounds the one List: kubelet answers a local call at
// once or not at all.
const podResourcesTimeout = 5 * time.Second

// podLister is the one PodResources call the doctor makes (the generated
// client has it).
type podLister interface {
	List(ctx context.Context, in *podresv1.ListPodResourcesRequest, opts ...grpc.CallOption) (*podresv1.ListPodResourcesResponse, error)
}

// collectPodResources asks kubelet's PodResources socket which container
// holds which devices.
func collectPodResources(ctx context.Context, socket string) evidence.PodResourcesEvidence {
	ev := evidence.PodResourcesEvidence{Socket: socket}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		ev.Unread = fmt.Sprintf("connect to kubelet's PodResources socket %s (pass --pod-resources-socket): %v", socket, err)
		return ev
	}
	defer conn.Close()
	return listPodResources(ctx, podresv1.NewPodResourcesListerClient(conn), ev)
}

// listPodResources fills ev from l's List: each container's device-plugin
// devices, by resource.
func listPodResources(ctx context.Context, l podLister, ev evidence.PodResourcesEvidence) evidence.PodResourcesEvidence {
	ctx, cancel := context.WithTimeout(ctx, podResourcesTimeout)
	defer cancel()
	resp, err := l.List(ctx, &podresv1.ListPodResourcesRequest{})
	if err != nil {
		ev.Unread = fmt.Sprintf("list kubelet's PodResources at %s (run the doctor as root on the worker, or pass --pod-resources-socket): %v", ev.Socket, err)
		return ev
	}
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			ref := evidence.PodRef{Namespace: p.GetNamespace(), Name: p.GetName(), Container: c.GetName()}
			for _, d := range c.GetDevices() {
				if len(d.GetDeviceIds()) > 0 {
					ev.Containers = append(ev.Containers, evidence.ContainerDevices{PodRef: ref, Resource: d.GetResourceName(), IDs: slices.Clone(d.GetDeviceIds())})
				}
			}
		}
	}
	slices.SortFunc(ev.Containers, func(a, b evidence.ContainerDevices) int {
		return strings.Compare(a.String()+" "+a.Resource, b.String()+" "+b.Resource)
	})
	return ev
}
