module github.com/nvinject/nvinject/cdi

go 1.26.8

require (
	github.com/nvinject/nvinject/shared v0.0.0-00010101000000-000000000000
	github.com/opencontainers/runtime-spec v1.3.0
	golang.org/x/sys v0.49.0
	sigs.k8s.io/yaml v1.6.0
	tags.cncf.io/container-device-interface v1.1.2
	tags.cncf.io/container-device-interface/specs-go v1.1.1
)

require (
	github.com/NVIDIA/go-nvml v0.13.4-1 // indirect
	github.com/fsnotify/fsnotify v1.9.0 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	go.yaml.in/yaml/v2 v2.4.5 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)

replace github.com/nvinject/nvinject/shared => ../shared
