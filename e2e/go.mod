module github.com/nvinject/nvinject/e2e

go 1.26.8
