module github.com/nvinject/nvinject/cdi

go 1.26.8
