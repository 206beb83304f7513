package rig

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// VLLMSelector selects the vLLM stand-in's pods (deploy/examples/vllm).
const VLLMSelector = "app=vllm-demo"

// VLLMKustomization is the stand-in's kustomization (base deploy/examples/vllm).
func (d *Deployer) VLLMKustomization() string {
	return filepath.Join(d.repo, "e2e", "harness", "rig", "vllm")
}

// RunVLLM applies the vLLM stand-in and returns its Ready pod.
func (d *Deployer) RunVLLM(ctx context.Context, timeout time.Duration) (*corev1.Pod, error) {
	if _, err := d.kube.Kubectl(ctx, "", "apply", "-k", d.VLLMKustomization()); err != nil {
		return nil, fmt.Errorf("apply the vLLM stand-in: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var ready *corev1.Pod
	err := Poll(ctx, 500*time.Millisecond, func(ctx context.Context) error {
		p, err := d.readyPod(ctx, "default", VLLMSelector)
		ready = p
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("vLLM stand-in not Ready: %w; see `kubectl describe pod -l %s` and the nvinject-nri log", err, VLLMSelector)
	}
	return ready, nil
}

// DeleteVLLM removes the stand-in and waits until its pods are gone.
func (d *Deployer) DeleteVLLM(ctx context.Context) error {
	if _, err := d.kube.Kubectl(ctx, "", "delete", "-k", d.VLLMKustomization(), "--ignore-not-found", "--wait=true"); err != nil {
		return fmt.Errorf("delete the vLLM stand-in: %w", err)
	}
	return d.WaitPodsGone(ctx, "default", VLLMSelector)
}

// WaitPodsGone waits until no pod matches selector in ns.
func (d *Deployer) WaitPodsGone(ctx context.Context, ns, selector string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return Poll(ctx, 500*time.Millisecond, func(ctx context.Context) error {
		pods, err := d.kube.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d pods %s remain in %s", len(pods.Items), selector, ns)
		}
		return nil
	})
}

func (d *Deployer) readyPod(ctx context.Context, ns, selector string) (*corev1.Pod, error) {
	pods, err := d.kube.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
				return p, nil
			}
		}
	}
	return nil, fmt.Errorf("no Ready pod %s in %s (%s)", selector, ns, podStates(pods.Items))
}

func podStates(pods []corev1.Pod) string {
	var s []string
	for _, p := range pods {
		st := string(p.Status.Phase)
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil {
				st += " " + w.Reason + ": " + w.Message
			}
		}
		s = append(s, p.Name+" "+st)
	}
	return strings.Join(s, "; ")
}

// CompletionRequest is the body sent to the stand-in's /v1/completions.
const CompletionRequest = `{"model":"Qwen/Qwen2.5-0.5B-Instruct","prompt":"Which GPU am I running on?","max_tokens":16}`

// Complete sends one completion request to the pod at ip:8000 and returns the reply.
func Complete(ctx context.Context, ip string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	url := "http://" + ip + ":8000/v1/completions"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(CompletionRequest))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	var body json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return "", fmt.Errorf("POST %s: %s, undecodable reply: %w", url, resp.Status, err)
	}
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("POST %s: %s: %s", url, resp.Status, body)
	}
	return string(body), nil
}
