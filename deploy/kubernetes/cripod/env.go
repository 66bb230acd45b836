package cripod

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// environment is the container's environment (the kubelet's
// makeEnvironmentVariables without service links): envFrom's ConfigMaps,
// then env over them, each value's $(VAR) references expanded with the
// variables before it; sorted by name.
func (p *Pod) environment(c corev1.Container, ns string) ([]*runtimeapi.KeyValue, error) {
	vars := map[string]string{}
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil {
			return nil, fmt.Errorf("%w: %s: envFrom other than a ConfigMap", ErrUnsupported, c.Name)
		}
		cm := p.env[from.ConfigMapRef.Name]
		if cm == nil {
			if from.ConfigMapRef.Optional != nil && *from.ConfigMapRef.Optional {
				continue
			}
			return nil, fmt.Errorf("cripod: %s: envFrom: no ConfigMap %q", c.Name, from.ConfigMapRef.Name)
		}
		for k, v := range cm.Data {
			vars[from.Prefix+k] = v
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			vars[e.Name] = expand(e.Value, vars)
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm := p.env[ref.Name]
			v, ok := "", false
			if cm != nil {
				v, ok = cm.Data[ref.Key]
			}
			if !ok {
				if ref.Optional != nil && *ref.Optional {
					continue
				}
				return nil, fmt.Errorf("cripod: %s: env %s: no key %q in the ConfigMap %q", c.Name, e.Name, ref.Key, ref.Name)
			}
			vars[e.Name] = v
		case e.ValueFrom.FieldRef != nil:
			v, err := p.field(e.ValueFrom.FieldRef.FieldPath, ns)
			if err != nil {
				return nil, fmt.Errorf("%s: env %s: %w", c.Name, e.Name, err)
			}
			vars[e.Name] = v
		default:
			return nil, fmt.Errorf("%w: %s: env %s: a value from other than a ConfigMap key or a pod field", ErrUnsupported, c.Name, e.Name)
		}
	}
	var out []*runtimeapi.KeyValue
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range vars {
			if !yield(k) {
				return
			}
		}
	}) {
		out = append(out, &runtimeapi.KeyValue{Key: k, Value: []byte(vars[k])})
	}
	return out, nil
}

// field is the downward API's value of a pod field.
func (p *Pod) field(path, ns string) (string, error) {
	switch path {
	case "metadata.name":
		return p.opts.Name, nil
	case "metadata.namespace":
		return ns, nil
	case "metadata.uid":
		return p.opts.UID, nil
	case "spec.nodeName":
		return p.opts.NodeName, nil
	case "spec.serviceAccountName":
		return p.spec.ServiceAccountName, nil
	}
	return "", fmt.Errorf("%w: the field %q (the pod's and the node's addresses are not known here)", ErrUnsupported, path)
}

// expand replaces $(VAR) with VAR's value where VAR is defined, and $$ with
// $ (k8s.io/kubernetes third_party/forked/golang/expansion); an undefined
// reference stays as written.
func expand(s string, vars map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := vars[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

func expandAll(args []string, vars map[string]string) []string {
	if args == nil {
		return nil
	}
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = expand(a, vars)
	}
	return out
}
