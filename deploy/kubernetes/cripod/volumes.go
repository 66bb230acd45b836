package cripod

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Volume is one of the pod's volumes on the node.
type Volume struct {
	Name string
	// Path is where it is on the node: the hostPath (moved by
	// Options.HostPaths), or a directory under the pod's (emptyDir,
	// ConfigMap).
	Path string
	// HostPath is the hostPath volume's path as the manifest says, "" for
	// other kinds.
	HostPath string
	// Type is the hostPath's type, checked (and for DirectoryOrCreate and
	// FileOrCreate made) by Materialize; "" for other kinds.
	Type corev1.HostPathType
	// EmptyDir is an emptyDir (made 0777, as the kubelet makes one).
	EmptyDir bool
	// Files are a ConfigMap volume's files, by name (mode 0644), written
	// by Materialize; the volume is always mounted read-only.
	Files map[string]string
}

// volumes places the pod's volumes on the node.
func (p *Pod) volumes(configMaps map[string]*corev1.ConfigMap) ([]Volume, error) {
	var out []Volume
	for _, v := range p.spec.Volumes {
		switch {
		case v.HostPath != nil:
			t := corev1.HostPathUnset
			if v.HostPath.Type != nil {
				t = *v.HostPath.Type
			}
			out = append(out, Volume{Name: v.Name, Path: p.onNode(v.HostPath.Path), HostPath: v.HostPath.Path, Type: t})
		case v.EmptyDir != nil:
			if v.EmptyDir.Medium != corev1.StorageMediumDefault {
				return nil, fmt.Errorf("%w: volume %s: an emptyDir of medium %q", ErrUnsupported, v.Name, v.EmptyDir.Medium)
			}
			out = append(out, Volume{Name: v.Name, Path: filepath.Join(p.opts.PodDir, "volumes", "kubernetes.io~empty-dir", v.Name), EmptyDir: true})
		case v.ConfigMap != nil:
			cm := configMaps[v.ConfigMap.Name]
			if cm == nil {
				return nil, fmt.Errorf("cripod: volume %s: no ConfigMap %q", v.Name, v.ConfigMap.Name)
			}
			if len(v.ConfigMap.Items) > 0 || len(cm.BinaryData) > 0 || v.ConfigMap.DefaultMode != nil && *v.ConfigMap.DefaultMode != 0o644 {
				return nil, fmt.Errorf("%w: volume %s: ConfigMap items, binary data or a mode other than 0644", ErrUnsupported, v.Name)
			}
			files := map[string]string{}
			for k, d := range cm.Data {
				files[k] = d
			}
			out = append(out, Volume{Name: v.Name, Path: filepath.Join(p.opts.PodDir, "volumes", "kubernetes.io~configmap", v.Name), Files: files})
		default:
			return nil, fmt.Errorf("%w: volume %s: only hostPath, emptyDir and configMap volumes", ErrUnsupported, v.Name)
		}
	}
	return out, nil
}

// onNode is a host path as Options.HostPaths moves it.
func (p *Pod) onNode(path string) string {
	best := ""
	for from := range p.opts.HostPaths {
		if (path == from || strings.HasPrefix(path, strings.TrimSuffix(from, "/")+"/")) && len(from) > len(best) {
			best = from
		}
	}
	if best == "" {
		return path
	}
	return filepath.Join(p.opts.HostPaths[best], strings.TrimPrefix(path, best))
}

func (p *Pod) volume(name string) *Volume {
	for i := range p.Volumes {
		if p.Volumes[i].Name == name {
			return &p.Volumes[i]
		}
	}
	return nil
}

// mounts are the container's mounts (the kubelet's makeMounts): each
// volume mount at its path, read-only as asked (a ConfigMap always), a
// subPath below its volume; and the termination-message file.
func (p *Pod) mounts(c corev1.Container) ([]*runtimeapi.Mount, error) {
	var out []*runtimeapi.Mount
	for _, m := range c.VolumeMounts {
		v := p.volume(m.Name)
		if v == nil {
			return nil, fmt.Errorf("cripod: %s: volume mount %q: no such volume", c.Name, m.Name)
		}
		host := v.Path
		if m.SubPath != "" {
			if filepath.IsAbs(m.SubPath) || slices.Contains(strings.Split(m.SubPath, "/"), "..") {
				return nil, fmt.Errorf("cripod: %s: volume mount %q: subPath %q must be a relative path within the volume", c.Name, m.Name, m.SubPath)
			}
			host = filepath.Join(host, m.SubPath)
		}
		mount := &runtimeapi.Mount{ContainerPath: m.MountPath, HostPath: host, Readonly: m.ReadOnly || v.Files != nil}
		if m.MountPropagation != nil {
			switch *m.MountPropagation {
			case corev1.MountPropagationNone:
			case corev1.MountPropagationHostToContainer:
				mount.Propagation = runtimeapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER
			case corev1.MountPropagationBidirectional:
				mount.Propagation = runtimeapi.MountPropagation_PROPAGATION_BIDIRECTIONAL
			default:
				return nil, fmt.Errorf("cripod: %s: volume mount %q: propagation %q", c.Name, m.Name, *m.MountPropagation)
			}
		}
		rro, err := recursiveReadOnly(m, p.opts.RecursiveReadOnlyMounts)
		if err != nil {
			return nil, fmt.Errorf("cripod: %s: %w", c.Name, err)
		}
		mount.RecursiveReadOnly = rro
		out = append(out, mount)
	}
	path := c.TerminationMessagePath
	if path == "" {
		path = corev1.TerminationMessagePathDefault
	}
	out = append(out, &runtimeapi.Mount{ContainerPath: path, HostPath: p.terminationLog(c.Name)})
	return out, nil
}

// recursiveReadOnly resolves a volume mount's recursiveReadOnly as the
// kubelet does (pkg/kubelet resolveRecursiveReadOnly): Disabled or unset is
// not recursive; otherwise the mount must be read-only and of no
// propagation (PRIVATE), and IfPossible is recursive if the runtime handler
// supports it, Enabled must be.
func recursiveReadOnly(m corev1.VolumeMount, supported bool) (bool, error) {
	if m.RecursiveReadOnly == nil || *m.RecursiveReadOnly == corev1.RecursiveReadOnlyDisabled {
		return false, nil
	}
	if !m.ReadOnly {
		return false, fmt.Errorf("volume mount %q: recursiveReadOnly %s needs readOnly: true", m.Name, *m.RecursiveReadOnly)
	}
	if m.MountPropagation != nil && *m.MountPropagation != corev1.MountPropagationNone {
		return false, fmt.Errorf("volume mount %q: recursiveReadOnly %s needs mountPropagation None", m.Name, *m.RecursiveReadOnly)
	}
	switch *m.RecursiveReadOnly {
	case corev1.RecursiveReadOnlyIfPossible:
		return supported, nil
	case corev1.RecursiveReadOnlyEnabled:
		if !supported {
			return false, fmt.Errorf("volume mount %q: recursiveReadOnly Enabled, but the runtime handler does not support recursive read-only mounts", m.Name)
		}
		return true, nil
	default:
		return false, fmt.Errorf("volume mount %q: unknown recursiveReadOnly %q", m.Name, *m.RecursiveReadOnly)
	}
}

func (p *Pod) terminationLog(container string) string {
	return filepath.Join(p.opts.PodDir, "containers", container, "termination-log")
}

// Materialize makes on the node what the pod's containers mount, as the
// kubelet does before it starts them: each hostPath checked by its type
// (DirectoryOrCreate made 0755, FileOrCreate 0644; Directory, File, Socket,
// CharDevice and BlockDevice must exist as such; an unset type is not
// checked), each emptyDir 0777, each ConfigMap's files, each subPath
// directory (with its volume's mode), the log and termination-message
// files.
func (p *Pod) Materialize() error {
	for _, v := range p.Volumes {
		if err := v.materialize(); err != nil {
			return err
		}
	}
	for _, c := range slices.Concat(p.spec.InitContainers, p.spec.Containers) {
		for _, m := range c.VolumeMounts {
			if m.SubPath == "" {
				continue
			}
			v := p.volume(m.Name)
			fi, err := os.Stat(v.Path)
			if err != nil {
				return fmt.Errorf("cripod: %s: subPath %s: %w", c.Name, m.SubPath, err)
			}
			if err := os.MkdirAll(filepath.Join(v.Path, m.SubPath), fi.Mode().Perm()); err != nil {
				return fmt.Errorf("cripod: %s: subPath %s: %w", c.Name, m.SubPath, err)
			}
		}
		term := p.terminationLog(c.Name)
		if err := os.MkdirAll(filepath.Dir(term), 0o750); err != nil {
			return fmt.Errorf("cripod: %w", err)
		}
		if err := os.WriteFile(term, nil, 0o666); err != nil {
			return fmt.Errorf("cripod: %w", err)
		}
		if err := os.MkdirAll(filepath.Join(p.Sandbox.LogDirectory, c.Name), 0o755); err != nil {
			return fmt.Errorf("cripod: %w", err)
		}
	}
	return nil
}

func (v Volume) materialize() error {
	switch {
	case v.EmptyDir:
		if err := os.MkdirAll(v.Path, 0o750); err != nil {
			return fmt.Errorf("cripod: emptyDir %s: %w", v.Name, err)
		}
		return os.Chmod(v.Path, 0o777)
	case v.Files != nil:
		if err := os.MkdirAll(v.Path, 0o755); err != nil {
			return fmt.Errorf("cripod: ConfigMap volume %s: %w", v.Name, err)
		}
		for name, data := range v.Files {
			if strings.Contains(name, "/") || name == ".." || name == "." {
				return fmt.Errorf("cripod: ConfigMap volume %s: key %q is not a file name", v.Name, name)
			}
			if err := os.WriteFile(filepath.Join(v.Path, name), []byte(data), 0o644); err != nil {
				return fmt.Errorf("cripod: ConfigMap volume %s: %w", v.Name, err)
			}
		}
		return nil
	}
	fi, err := os.Stat(v.Path)
	switch v.Type {
	case corev1.HostPathUnset:
		return nil
	case corev1.HostPathDirectoryOrCreate:
		if errors.Is(err, fs.ErrNotExist) {
			err = os.MkdirAll(v.Path, 0o755)
			fi, _ = os.Stat(v.Path)
		}
		if err == nil && !fi.IsDir() {
			err = errors.New("not a directory")
		}
	case corev1.HostPathFileOrCreate:
		if errors.Is(err, fs.ErrNotExist) {
			if err = os.MkdirAll(filepath.Dir(v.Path), 0o755); err == nil {
				err = os.WriteFile(v.Path, nil, 0o644)
			}
		} else if err == nil && !fi.Mode().IsRegular() {
			err = errors.New("not a regular file")
		}
	case corev1.HostPathDirectory:
		if err == nil && !fi.IsDir() {
			err = errors.New("not a directory")
		}
	case corev1.HostPathFile:
		if err == nil && !fi.Mode().IsRegular() {
			err = errors.New("not a regular file")
		}
	case corev1.HostPathSocket:
		if err == nil && fi.Mode().Type() != fs.ModeSocket {
			err = errors.New("not a socket")
		}
	case corev1.HostPathCharDev, corev1.HostPathBlockDev:
		want := fs.ModeDevice | fs.ModeCharDevice
		if v.Type == corev1.HostPathBlockDev {
			want = fs.ModeDevice
		}
		if err == nil && (fi.Mode().Type() != want || fi.Sys().(*syscall.Stat_t) == nil) {
			err = fmt.Errorf("not a %s", v.Type)
		}
	default:
		err = fmt.Errorf("type %q", v.Type)
	}
	if err != nil {
		return fmt.Errorf("cripod: hostPath volume %s (%s, on this node %s, type %s): %w", v.Name, v.HostPath, v.Path, v.Type, err)
	}
	return nil
}
