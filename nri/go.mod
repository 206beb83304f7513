module github.com/nvinject/nvinject/nri

go 1.26.8
