package collect

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The daemon's --cdi-spec-dir is a path in its container; the doctor reads the host's.
func TestHostPathOf(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		Volumes: []corev1.Volume{
			{Name: "cdi", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/node/cdi"}}},
			{Name: "run", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run"}}},
			{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{}}},
		},
		Containers: []corev1.Container{{VolumeMounts: []corev1.VolumeMount{
			{Name: "run", MountPath: "/var/run"},
			{Name: "cdi", MountPath: "/var/run/cdi/"},
			{Name: "cfg", MountPath: "/etc/nvinject"},
			{Name: "run", MountPath: "/host-run", SubPath: "nvinject"},
		}}},
	}}
	for in, want := range map[string]string{
		"/var/run/cdi":       "/tmp/node/cdi",
		"/var/run/cdi/x":     "/tmp/node/cdi/x",
		"/var/run/other":     "/run/other",
		"/var/run/cdi-other": "/run/cdi-other",
		"/etc/nvinject":      "/etc/nvinject",
		"/host-run/cdi":      "/run/nvinject/cdi",
		"/elsewhere":         "/elsewhere",
	} {
		if got := hostPathOf(pod, in); got != want {
			t.Errorf("hostPathOf(%q) = %q, want %q", in, got, want)
		}
	}
}
