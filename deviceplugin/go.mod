module github.com/nvinject/nvinject/deviceplugin

go 1.26.8

require (
	github.com/nvinject/nvinject/shared v0.0.0-00010101000000-000000000000
	tags.cncf.io/container-device-interface v1.1.2
)

require (
	github.com/NVIDIA/go-nvml v0.13.4-1 // indirect
	github.com/google/uuid v1.6.0 // indirect
)

replace (
	github.com/nvinject/nvinject/cdi => ../cdi
	github.com/nvinject/nvinject/shared => ../shared
)
