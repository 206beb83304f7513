#!/usr/bin/env bash
# nvkind-up.sh: the nvkind GPU setup on a GPU host, automated.
#
#   Ubuntu host, NVIDIA driver >= 580, NVIDIA Container Toolkit (Docker + CDI)
#   -> nvkind cluster "k8s-ai-infra" whose one worker gets ONE selected GPU
#   -> nvinject's containerd drop-in inside the worker, containerd restarted
#   -> kubectl apply -k deploy/overlays/nvkind-worker, ConfigMap UUID = that GPU
#   -> the example vLLM Deployment (deploy/examples/vllm)
#
# Then run the cluster suite:
#   KUBECONFIG=$PWD/k8s-ai-infra.kubeconfig make e2e-cluster
#
# Run from the repository root. Needs: docker, kind, nvkind, kubectl, go,
# nvidia-smi, nvidia-ctk. Environment:
#   CLUSTER_NAME   (k8s-ai-infra)  kind cluster name; the worker is $CLUSTER_NAME-worker
#   SELECTED_GPU   (first idle GPU with MIG off) UUID to give to the worker
#   KUBECONFIG_OUT ($PWD/$CLUSTER_NAME.kubeconfig)
#   IMAGE_TAG      (v0.1.0) tag of the nvinject images built by `make images`
#   CONFIGURE_HOST (0) 1: configure the toolkit for nvkind (changes Docker's
#                  config and restarts Docker)
#   WITH_VLLM      (1) 0: skip the vLLM example
set -euo pipefail

CLUSTER_NAME=${CLUSTER_NAME:-k8s-ai-infra}
WORKER=${CLUSTER_NAME}-worker
KUBECONFIG_OUT=${KUBECONFIG_OUT:-$PWD/$CLUSTER_NAME.kubeconfig}
IMAGE_TAG=${IMAGE_TAG:-v0.1.0}
IMAGE_REGISTRY=${IMAGE_REGISTRY:-ghcr.io/nvinject}
CONFIGURE_HOST=${CONFIGURE_HOST:-0}
WITH_VLLM=${WITH_VLLM:-1}

log() { printf '\n== %s\n' "$*" >&2; }
die() { printf 'nvkind-up: %s\n' "$*" >&2; exit 1; }

[ -f deploy/overlays/nvkind-worker/kustomization.yaml ] || die "run from the repository root"
for tool in docker kind nvkind kubectl go nvidia-smi; do
	command -v "$tool" >/dev/null || die "$tool is not installed (see the header of this script)"
done

log "host driver"
nvidia-smi --query-gpu=index,uuid,name,mig.mode.current,memory.used --format=csv,noheader \
	|| die "nvidia-smi fails on the host: fix the driver first (the doctor's driver layer)"

if [ "$CONFIGURE_HOST" = 1 ]; then
	# nvkind passes GPUs to kind nodes as /var/run/nvidia-container-devices/<id>
	# volume mounts, which the toolkit only honours with this setting.
	log "configure the NVIDIA Container Toolkit for nvkind"
	sudo nvidia-ctk runtime configure --runtime=docker --set-as-default --cdi.enabled
	sudo nvidia-ctk config --set accept-nvidia-visible-devices-as-volume-mounts=true --in-place
	sudo systemctl restart docker
fi

if [ -z "${SELECTED_GPU:-}" ]; then
	# The nvkind setup gives the worker an idle A100 without MIG.
	SELECTED_GPU=$(nvidia-smi --query-gpu=uuid,mig.mode.current,memory.used --format=csv,noheader,nounits \
		| awk -F', *' '($2 == "Disabled" || $2 == "[N/A]") && $3 < 100 { print $1; exit }')
	[ -n "$SELECTED_GPU" ] || die "no idle GPU with MIG disabled; set SELECTED_GPU=<uuid>"
fi
log "selected GPU $SELECTED_GPU"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

log "nvkind cluster $CLUSTER_NAME: one worker holding $SELECTED_GPU"
cat >"$work/template.yaml" <<'TEMPLATE'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
- role: control-plane
{{- range $worker := $.workers }}
- role: worker
  extraMounts:
  {{- range $device := $worker.devices }}
  - hostPath: /dev/null
    containerPath: /var/run/nvidia-container-devices/{{ $device }}
  {{- end }}
{{- end }}
TEMPLATE
cat >"$work/values.yaml" <<VALUES
workers:
- devices: ["$SELECTED_GPU"]
VALUES
if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
	nvkind cluster create --name "$CLUSTER_NAME" --config-template "$work/template.yaml" --config-values "$work/values.yaml"
fi
kind get kubeconfig --name "$CLUSTER_NAME" >"$KUBECONFIG_OUT"
export KUBECONFIG=$KUBECONFIG_OUT

log "worker's device view (the GPU status check)"
seen=$(docker exec "$WORKER" nvidia-smi --query-gpu=index,uuid,name,mig.mode.current --format=csv,noheader)
echo "$seen"
grep -q "$SELECTED_GPU" <<<"$seen" || die "$WORKER does not see $SELECTED_GPU: check nvkind and the toolkit (CONFIGURE_HOST=1)"
[ "$(wc -l <<<"$seen")" -eq 1 ] || die "$WORKER sees more than the selected GPU"

log "nvinject containerd drop-in in $WORKER"
CGO_ENABLED=0 GOOS=linux go build -o "$work/nvinject-node" ./deploy/cmd/nvinject-node
docker cp "$work/nvinject-node" "$WORKER:/usr/local/bin/nvinject-node"
docker exec "$WORKER" /usr/local/bin/nvinject-node install-containerd-config
docker exec "$WORKER" systemctl restart containerd
docker exec "$WORKER" sh -c 'until crictl info >/dev/null 2>&1; do sleep 1; done'

log "nvinject images into the kind nodes"
for img in device-plugin nri; do
	ref=$IMAGE_REGISTRY/nvinject-$img:$IMAGE_TAG
	docker image inspect "$ref" >/dev/null 2>&1 || make "image-$img" IMAGE_TAG="$IMAGE_TAG" IMAGE_REGISTRY="$IMAGE_REGISTRY"
	kind load docker-image --name "$CLUSTER_NAME" "$ref"
done

log "kubectl apply -k deploy/overlays/nvkind-worker (ConfigMap UUID = $SELECTED_GPU)"
kubectl apply -k deploy/overlays/nvkind-worker
kubectl -n nvidia-device-plugin patch configmap single-gpu-device-plugin --type merge \
	-p "{\"data\":{\"selected-gpu-uuid\":\"$SELECTED_GPU\"}}"
kubectl -n nvidia-device-plugin rollout restart daemonset/single-gpu-device-plugin
kubectl -n nvidia-device-plugin rollout status daemonset/single-gpu-device-plugin --timeout=5m
kubectl -n nvidia-device-plugin rollout status daemonset/nvinject-nri --timeout=5m

log "Node resources (want capacity 1, allocatable 1)"
for _ in $(seq 60); do
	cap=$(kubectl get node "$WORKER" -o jsonpath='{.status.capacity.nvidia\.com/gpu}')
	[ "$cap" = 1 ] && break
	sleep 2
done
kubectl get node "$WORKER" -o jsonpath='{"capacity="}{.status.capacity.nvidia\.com/gpu}{" allocatable="}{.status.allocatable.nvidia\.com/gpu}{"\n"}'

if [ "$WITH_VLLM" = 1 ]; then
	log "the example vLLM Deployment"
	kubectl apply -k deploy/examples/vllm
fi

log "done"
cat <<DONE
KUBECONFIG=$KUBECONFIG_OUT
  kubectl get pods -A -o wide
  go run ./doctor/cmd/nvinject-doctor --kubeconfig \$KUBECONFIG --node-name $WORKER
  KUBECONFIG=$KUBECONFIG_OUT make e2e-cluster
DONE
