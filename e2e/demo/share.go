package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/nvinject/nvinject/e2e/harness/rig"
	"github.com/nvinject/nvinject/shared/contract"
)

// shareExample is the example share claim and its pod, relative to the
// repository root.
const shareExample = "deploy/examples/dra/gpu-share-claim.yaml"

// shareLimits are what the example's share (40Gi, computePercent 50) sets
// on its MPS daemon, as nvidia-cuda-mps-control answers them.
var shareLimits = []string{"50.0", "40G"}

// shareExampleObjects reads the example's ResourceClaimTemplate and Pod;
// the pod runs the stand-in's image (the node has no registry).
func shareExampleObjects(repo string) (*resourceapi.ResourceClaimTemplate, *corev1.Pod, error) {
	data, err := os.ReadFile(filepath.Join(repo, shareExample))
	if err != nil {
		return nil, nil, err
	}
	var tmpl *resourceapi.ResourceClaimTemplate
	var pod *corev1.Pod
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", shareExample, err)
		}
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", shareExample, err)
		}
		switch meta.Kind {
		case "ResourceClaimTemplate":
			tmpl = &resourceapi.ResourceClaimTemplate{}
			err = yaml.Unmarshal(doc, tmpl)
		case "Pod":
			pod = &corev1.Pod{}
			err = yaml.Unmarshal(doc, pod)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %s: %w", shareExample, meta.Kind, err)
		}
	}
	if tmpl == nil || pod == nil || len(pod.Spec.Containers) != 1 {
		return nil, nil, fmt.Errorf("%s: want one ResourceClaimTemplate and one one-container Pod", shareExample)
	}
	c := &pod.Spec.Containers[0]
	c.Image, c.ImagePullPolicy, c.Command = rig.VLLMImage, corev1.PullNever, []string{"sleep", "infinity"}
	return tmpl, pod, nil
}

// showShare (MODE=dra): nvinject-dra redeployed with
// deploy/components/dra-gpu-shares, and the example share claim's pod
// running on the node's other GPU beside the vLLM pod's whole GPU; inside
// it, the share's own MPS daemon answers the share's limits.
func (e evidence) showShare(ctx context.Context, repo string) error {
	sh, d := e.sh, e.d
	drv := d.Driver()
	sh.section("a GPU share (KEP-5075 consumable capacity) beside the whole GPU")
	if !drv.Real() {
		sh.note("not shown: a share is enforced by NVIDIA's real MPS control daemon, which %s lacks", drv)
		return nil
	}
	t0 := time.Now()
	if _, err := d.ApplyDRAComponent(ctx, "dra-gpu-shares"); err != nil {
		return err
	}
	sh.note("patched DaemonSet %s with deploy/components/dra-gpu-shares (--gpu-shares); Ready again in %s, the vLLM pod's claim kept in its checkpoint",
		rig.DRADaemonSet, time.Since(t0).Round(10*time.Millisecond))
	if err := d.WaitSliceDevice(ctx, contract.DRAShareDeviceName(1), true); err != nil {
		return err
	}
	if err := e.runAll(ctx, e.kubectl("get", "resourceslices", "--field-selector", "spec.nodeName="+d.Node().Name()+",spec.driver="+contract.DRADriver, "-o",
		`jsonpath={range .items[*].spec.devices[*]}{.name}`+attr(contract.DRAAttrType)+attr(contract.DRAAttrUUID)+`{" memory="}{.capacity.memory.value}{" computePercent="}{.capacity.computePercent.value}{" allowMultipleAllocations="}{.allowMultipleAllocations}{"\n"}{end}`)); err != nil {
		return err
	}

	tmpl, pod, err := shareExampleObjects(repo)
	if err != nil {
		return err
	}
	client := d.Kube().Client
	if _, err := client.ResourceV1().ResourceClaimTemplates(tmpl.Namespace).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ResourceClaimTemplate %s from %s: %w", tmpl.Name, shareExample, err)
	}
	if _, err := client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s from %s: %w", pod.Name, shareExample, err)
	}
	sh.note("created %s's ResourceClaimTemplate %s (40Gi, computePercent 50 of a %s device) and pod %s (image %s: no registry here)",
		shareExample, tmpl.Name, contract.DRAShareClass, pod.Name, rig.VLLMImage)
	var running *corev1.Pod
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := rig.Poll(wctx, 200*time.Millisecond, func(ctx context.Context) error {
		p, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err == nil && p.Status.Phase != corev1.PodRunning {
			err = fmt.Errorf("pod %s is %s", pod.Name, p.Status.Phase)
		}
		running = p
		return err
	}); err != nil {
		return fmt.Errorf("%w; see kubectl describe pod %s and nvinject-dra's log", err, pod.Name)
	}
	claim, err := d.ClaimOf(ctx, running)
	if err != nil {
		return err
	}
	if err := e.runAll(ctx, e.kubectl("get", "resourceclaim", claim.Name, "-n", claim.Namespace, "-o",
		`jsonpath={range .status.allocation.devices.results[*]}{"allocated: device="}{.device}{" shareID="}{.shareID}{" consumedCapacity="}{.consumedCapacity}{"\n"}{end}`)); err != nil {
		return err
	}
	uuid, err := e.allocatedUUID(ctx, claim)
	if err != nil {
		return err
	}
	vclaim, err := d.ClaimOf(ctx, e.pod)
	if err != nil {
		return err
	}
	vllm, err := e.allocatedUUID(ctx, vclaim)
	if err != nil {
		return err
	}
	if uuid == vllm {
		return fmt.Errorf("the share claim %s got GPU %s, the vLLM pod's whole GPU", claim.Name, uuid)
	}
	got, err := sh.run(ctx, e.kubectl("exec", "-n", pod.Namespace, pod.Name, "--", "/bin/sh", "-c",
		`nvidia-smi-sim --query-gpu=uuid --format=csv,noheader; env | grep '^CUDA_MPS_' | sort; echo get_default_active_thread_percentage | nvidia-cuda-mps-control; echo get_default_device_pinned_mem_limit 0 | nvidia-cuda-mps-control`)...)
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) < 3 || lines[0] != uuid || !slices.Equal(lines[len(lines)-2:], shareLimits) {
		sh.note("MISMATCH: want GPU %s and the share's limits %v", uuid, shareLimits)
		return fmt.Errorf("pod %s does not see its share: GPU %s with its MPS daemon's limits %v", pod.Name, uuid, shareLimits)
	}
	sh.note("MATCH: pod %s sees only GPU %s, beside the vLLM pod's whole GPU %s; the share's own MPS daemon (NVIDIA's real control program) answers %s%% of the threads and %s of pinned memory",
		pod.Name, uuid, vllm, shareLimits[0], shareLimits[1])
	return nil
}

// allocatedUUID is the GPU UUID of the device claim's one allocation
// result names in nvinject-dra's slices.
func (e evidence) allocatedUUID(ctx context.Context, claim *resourceapi.ResourceClaim) (string, error) {
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		return "", fmt.Errorf("ResourceClaim %s/%s allocates %+v, want one device of %s", claim.Namespace, claim.Name, claim.Status.Allocation, contract.DRADriver)
	}
	r := claim.Status.Allocation.Devices.Results[0]
	if r.Driver != contract.DRADriver || r.Pool != e.d.Node().Name() {
		return "", fmt.Errorf("ResourceClaim %s/%s is allocated %s/%s/%s, not a device of %s on node %s", claim.Namespace, claim.Name, r.Driver, r.Pool, r.Device, contract.DRADriver, e.d.Node().Name())
	}
	devs, err := e.d.SliceDevices(ctx)
	if err != nil {
		return "", err
	}
	for _, dv := range devs {
		if u := dv.Attributes[contract.DRAAttrUUID].StringValue; dv.Name == r.Device && u != nil {
			return *u, nil
		}
	}
	return "", fmt.Errorf("ResourceClaim %s/%s is allocated device %s, which nvinject-dra's slices do not publish with a %s attribute", claim.Namespace, claim.Name, r.Device, contract.DRAAttrUUID)
}

// deleteShare removes the example share's pod and template (teardown:
// kubelet unprepares the claim, stopping its MPS daemon, while
// nvinject-dra still runs).
func deleteShare(ctx context.Context, d *rig.Deployer, repo string) error {
	tmpl, pod, err := shareExampleObjects(repo)
	if err != nil {
		return err
	}
	pods, zero := d.Kube().Client.CoreV1().Pods(pod.Namespace), int64(0)
	if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := rig.Poll(wctx, 500*time.Millisecond, func(ctx context.Context) error {
		_, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err == nil {
			return fmt.Errorf("pod %s still there", pod.Name)
		}
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}); err != nil {
		return err
	}
	if err := d.Kube().Client.ResourceV1().ResourceClaimTemplates(tmpl.Namespace).Delete(ctx, tmpl.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}
