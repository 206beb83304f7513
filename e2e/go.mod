module github.com/nvinject/nvinject/e2e

go 1.26.8

require github.com/pelletier/go-toml/v2 v2.4.3
