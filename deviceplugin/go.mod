module github.com/nvinject/nvinject/deviceplugin

go 1.26.8
