// Package deploy holds nvinject's deployment sources (kustomize base and
// overlays, Helm chart, containerd drop-in) and embeds them, so the renderer
// and the node installer use exactly the files that kubectl and helm read.
package deploy

import "embed"

// Files is the deploy tree: kustomization.yaml, base/, components/, overlays/,
// helm/nvinject/ and containerd/nvinject.toml, at their repository paths.
//
//go:embed kustomization.yaml base components overlays all:helm/nvinject containerd/nvinject.toml
var Files embed.FS

// ContainerdDropIn is the containerd config drop-in nvinject-node installs.
//
//go:embed containerd/nvinject.toml
var ContainerdDropIn []byte

// ChartDir is the Helm chart's directory within Files.
const ChartDir = "helm/nvinject"
