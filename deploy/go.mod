module github.com/nvinject/nvinject/deploy

go 1.26.8
