package cripod

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Objects are what Build found in a kustomization's output: its one
// DaemonSet and its ConfigMaps by name (the built name, with kustomize's
// hash suffix, as the DaemonSet refers to them).
type Objects struct {
	DaemonSet  *appsv1.DaemonSet
	ConfigMaps map[string]*corev1.ConfigMap
	YAML       []byte // the whole output, as kubectl apply -k would send it
}

// Build runs kustomize on the kustomization in dir as kubectl apply -k does
// (krusty, default options: files only at or below each kustomization's
// root) and decodes the DaemonSet and the ConfigMaps of its output strictly
// (DecodeStrict). The output must hold exactly one DaemonSet.
func Build(dir string) (*Objects, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("cripod: %s: %w", dir, err)
	}
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		return nil, fmt.Errorf("cripod: kustomize build %s: %w", dir, err)
	}
	out, err := rm.AsYaml()
	if err != nil {
		return nil, fmt.Errorf("cripod: kustomize build %s: %w", dir, err)
	}
	objs := &Objects{ConfigMaps: map[string]*corev1.ConfigMap{}, YAML: out}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(out), -1) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, fmt.Errorf("cripod: kustomize build %s: %w", dir, err)
		}
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 DaemonSet":
			if objs.DaemonSet != nil {
				return nil, fmt.Errorf("cripod: kustomize build %s: more than one DaemonSet", dir)
			}
			objs.DaemonSet = &appsv1.DaemonSet{}
			if err := DecodeStrict([]byte(doc), objs.DaemonSet); err != nil {
				return nil, fmt.Errorf("cripod: %s: %w", dir, err)
			}
		case "v1 ConfigMap":
			cm := &corev1.ConfigMap{}
			if err := DecodeStrict([]byte(doc), cm); err != nil {
				return nil, fmt.Errorf("cripod: %s: %w", dir, err)
			}
			objs.ConfigMaps[cm.Name] = cm
		}
	}
	if objs.DaemonSet == nil {
		return nil, fmt.Errorf("cripod: kustomize build %s: no DaemonSet", dir)
	}
	return objs, nil
}

// DecodeStrict decodes one YAML document into obj as the API server does:
// case-sensitive field names, unknown and duplicate fields rejected
// (sigs.k8s.io/json; encoding/json alone, and so yaml.UnmarshalStrict,
// would take "readonly" for "readOnly").
func DecodeStrict(doc []byte, obj any) error {
	js, err := yaml.YAMLToJSONStrict(doc) // duplicate keys are an error
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(js, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err == nil {
		err = errors.Join(strict...)
	}
	return err
}
