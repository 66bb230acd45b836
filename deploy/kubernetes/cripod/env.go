package cripod

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// environment is the container's environment (the kubelet's
// makeEnvironmentVariables without service links): envFrom's ConfigMaps,
// then env over them, each value's $(VAR) references expanded with the
// variables before it and the Service kubernetes's; then the Service
// kubernetes's variables not set already (the kubelet adds them even
// without service links). Sorted by name: the kubelet hands them over in
// its map's order, which is random, and a sorted list keeps the rendered
// configs reproducible.
func (p *Pod) environment(c corev1.Container, ns string) ([]*runtimeapi.KeyValue, error) {
	service, err := p.serviceEnv()
	if err != nil {
		return nil, fmt.Errorf("cripod: %s: %w", c.Name, err)
	}
	vars := map[string]string{}
	// lookup is what $(VAR) sees: the variables so far, then the Service's.
	lookup := func() map[string]string {
		m := maps.Clone(service)
		maps.Copy(m, vars)
		return m
	}
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
			vars[e.Name] = expand(e.Value, lookup())
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
	for k, v := range service {
		if _, set := vars[k]; !set {
			vars[k] = v
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

// serviceEnv are the variables of the Service kubernetes (in default,
// its port named https), as the kubelet's envvars.FromServices writes them.
func (p *Pod) serviceEnv() (map[string]string, error) {
	addr := p.opts.KubernetesService
	if addr == "" {
		addr = "10.96.0.1:443"
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || net.ParseIP(host) == nil {
		return nil, fmt.Errorf("the Service kubernetes's address %q: want ClusterIP:port", addr)
	}
	url := "tcp://" + net.JoinHostPort(host, port)
	pre := "KUBERNETES_PORT_" + port + "_TCP"
	return map[string]string{
		"KUBERNETES_SERVICE_HOST":       host,
		"KUBERNETES_SERVICE_PORT":       port,
		"KUBERNETES_SERVICE_PORT_HTTPS": port,
		"KUBERNETES_PORT":               url,
		pre:                             url,
		pre + "_PROTO":                  "tcp",
		pre + "_PORT":                   port,
		pre + "_ADDR":                   host,
	}, nil
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
