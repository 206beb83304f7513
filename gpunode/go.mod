module github.com/nvinject/nvinject/gpunode

go 1.26.8

replace (
	github.com/nvinject/nvinject/cdi => ../cdi
	github.com/nvinject/nvinject/shared => ../shared
)

require (
	github.com/nvinject/nvinject/shared v0.0.0-00010101000000-000000000000
	google.golang.org/grpc v1.82.1
	k8s.io/kubelet v0.37.2
	tags.cncf.io/container-device-interface v1.1.2
)

require (
	github.com/NVIDIA/go-nvml v0.13.4-1 // indirect
	github.com/fsnotify/fsnotify v1.9.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/opencontainers/runtime-spec v1.3.0 // indirect
	go.opentelemetry.io/otel/metric v1.44.0 // indirect
	go.opentelemetry.io/otel/sdk v1.44.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260526163538-3dc84a4a5aaa // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	tags.cncf.io/container-device-interface/specs-go v1.1.1 // indirect
)
