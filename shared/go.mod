module github.com/nvinject/nvinject/shared

go 1.26.8

require (
	github.com/NVIDIA/go-nvml v0.13.4-1 // indirect
	github.com/prometheus/client_golang v1.23.2 // indirect
	tags.cncf.io/container-device-interface v1.1.2 // indirect
)
