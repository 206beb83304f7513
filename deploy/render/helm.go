package render

import (
	"bytes"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"

	"github.com/nvinject/nvinject/deploy"
	"github.com/nvinject/nvinject/shared/contract"
)

// Release names the Helm release Helm renders; Namespace is the manifests'.
const (
	Release   = "nvinject"
	Namespace = contract.Namespace
)

// Helm renders the embedded chart with values layered over values.yaml (and
// checked against values.schema.json), like `helm template nvinject
// deploy/helm/nvinject -n nvidia-device-plugin`.
func Helm(values map[string]any) ([]byte, error) {
	rendered, err := renderChart(values)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(rendered))
	for name := range rendered {
		if path.Ext(name) == ".yaml" {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var out bytes.Buffer
	for _, name := range names {
		doc := strings.TrimSpace(rendered[name])
		if doc == "" {
			continue
		}
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", name, doc)
	}
	return out.Bytes(), nil
}

// HelmNotes renders the chart's templates/NOTES.txt with values, the text
// helm install prints.
func HelmNotes(values map[string]any) (string, error) {
	rendered, err := renderChart(values)
	if err != nil {
		return "", err
	}
	for name, text := range rendered {
		if path.Base(name) == "NOTES.txt" {
			return text, nil
		}
	}
	return "", fmt.Errorf("chart %s has no templates/NOTES.txt", deploy.ChartDir)
}

// renderChart renders every template of the embedded chart, by file name.
func renderChart(values map[string]any) (map[string]string, error) {
	var files []*loader.BufferedFile
	err := fs.WalkDir(deploy.Files, deploy.ChartDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := deploy.Files.ReadFile(p)
		if err != nil {
			return err
		}
		files = append(files, &loader.BufferedFile{Name: strings.TrimPrefix(p, deploy.ChartDir+"/"), Data: data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read embedded chart %s: %w", deploy.ChartDir, err)
	}
	chrt, err := loader.LoadFiles(files)
	if err != nil {
		return nil, fmt.Errorf("load chart %s: %w", deploy.ChartDir, err)
	}
	opts := chartutil.ReleaseOptions{Name: Release, Namespace: Namespace, Revision: 1, IsInstall: true}
	vals, err := chartutil.ToRenderValues(chrt, values, opts, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, fmt.Errorf("chart %s values (see its values.yaml and values.schema.json): %w", deploy.ChartDir, err)
	}
	rendered, err := engine.Render(chrt, vals)
	if err != nil {
		return nil, fmt.Errorf("render chart %s: %w", deploy.ChartDir, err)
	}
	return rendered, nil
}
