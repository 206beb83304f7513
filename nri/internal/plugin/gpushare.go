package plugin

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	specs "tags.cncf.io/container-device-interface/specs-go"
)

// ReasonGPUShare: a container of a GPU share does not get exactly its
// share's MPS daemon and limits.
const ReasonGPUShare = "gpu-share"

// mpsEnvPrefix starts every MPS client variable a share's device sets
// (CUDA_MPS_PIPE_DIRECTORY, _ACTIVE_THREAD_PERCENTAGE, _PINNED_DEVICE_MEM_LIMIT).
const mpsEnvPrefix = "CUDA_MPS_"

// checkShare checks a container holding a GPU share as it will run: it
// holds one share; every MPS variable of the share's own CDI device has
// that value in the final environment (no pod env or other plugin changed
// the daemon or its limits); the share's pipe directory is mounted, and no
// other MPS daemon's (a sibling of it under the same MPS root) is.
func (h *Handler) checkShare(r *request, f final) error {
	var share *sharedClaim
	for _, d := range r.res.Devices {
		sc, ok := h.sharedClaimOf(d)
		if !ok || sc.share == "" {
			continue
		}
		if share != nil {
			return refuse(ReasonGPUShare, fmt.Errorf("%s: holds GPU shares of claims %s and %s; one container holds one share (its MPS client variables name one daemon): give the container one claim's share", r.who, share.uid, sc.uid))
		}
		share = &sc
		pipe := ""
		for _, kv := range d.Edits.Env {
			k, v, _ := strings.Cut(kv, "=")
			if !strings.HasPrefix(k, mpsEnvPrefix) {
				continue
			}
			if got, ok := lastEnv(f.env, k); !ok || got != v {
				return refuse(ReasonGPUShare, fmt.Errorf("%s: %s is %q in the container, not its GPU share's %q (claim %s, share %s); the share's MPS daemon and limits are set by its claim: remove %s from the pod's env, or the NRI plugin that sets it", r.who, k, got, v, sc.uid, sc.share, k))
			}
			if k == "CUDA_MPS_PIPE_DIRECTORY" {
				pipe = v
			}
		}
		if err := h.checkSharePipe(r, f, d.Edits.Mounts, pipe, sc); err != nil {
			return err
		}
	}
	return nil
}

// checkSharePipe: the share's own pipe directory is mounted where its
// variable says, and no sibling daemon's pipe directory is mounted at all.
func (h *Handler) checkSharePipe(r *request, f final, own []*specs.Mount, pipe string, sc sharedClaim) error {
	i := slices.IndexFunc(own, func(m *specs.Mount) bool { return m.ContainerPath == pipe })
	if pipe == "" || i < 0 {
		return refuse(ReasonGPUShare, fmt.Errorf("%s: the CDI device of GPU share %s (claim %s) mounts no MPS pipe directory; nvinject-dra wrote an incomplete spec: restart nvinject-dra so it writes the claim's spec again", r.who, sc.share, sc.uid))
	}
	src := own[i].HostPath
	root := filepath.Dir(filepath.Dir(src))
	mounted := false
	for _, m := range f.mounts {
		s := filepath.Clean(m.GetSource())
		if s == src && m.GetDestination() == pipe {
			mounted = true
			continue
		}
		if s != src && filepath.Dir(filepath.Dir(s)) == root && filepath.Base(s) == filepath.Base(src) {
			return refuse(ReasonGPUShare, fmt.Errorf("%s: mounts %s, another MPS daemon's pipe directory, beside its GPU share %s (claim %s, daemon %s); a share's container reaches its own daemon only: remove that mount", r.who, s, sc.share, sc.uid, src))
		}
	}
	if !mounted {
		return refuse(ReasonGPUShare, fmt.Errorf("%s: its GPU share's MPS pipe directory %s is not mounted at %s (claim %s, share %s); another plugin removed or moved it: the container would reach no daemon", r.who, src, pipe, sc.uid, sc.share))
	}
	return nil
}

// lastEnv is the value of variable k in env as the process sees it (the
// last entry wins).
func lastEnv(env []string, k string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], k+"="); ok {
			return v, true
		}
	}
	return "", false
}
