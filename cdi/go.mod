module github.com/nvinject/nvinject/cdi

go 1.26.8

require (
	github.com/nvinject/nvinject/shared v0.0.0-00010101000000-000000000000
	github.com/opencontainers/runtime-spec v1.2.1
	golang.org/x/sys v0.35.0
	sigs.k8s.io/yaml v1.6.0
	tags.cncf.io/container-device-interface v1.0.1
	tags.cncf.io/container-device-interface/specs-go v1.1.1
)

require (
	github.com/NVIDIA/go-nvml v0.13.4-1 // indirect
	github.com/fsnotify/fsnotify v1.7.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/opencontainers/runtime-tools v0.9.1-0.20221107090550-2e043c6bd626 // indirect
	github.com/syndtr/gocapability v0.0.0-20200815063812-42c35b437635 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)

replace github.com/nvinject/nvinject/shared => ../shared
