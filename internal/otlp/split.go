package otlp

import (
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// splitMetrics cuts rm into exports of at most max data points each, every
// one with rm's resource and each metric's scope, name, unit and kind: a
// collector refuses a request over its size (4 MiB by default), and 1000
// workloads with actor attributes make about 8 MB.
func splitMetrics(rm *metricdata.ResourceMetrics, max int) []*metricdata.ResourceMetrics {
	var out []*metricdata.ResourceMetrics
	cur := &metricdata.ResourceMetrics{Resource: rm.Resource}
	room := max
	flush := func() {
		if len(cur.ScopeMetrics) > 0 {
			out = append(out, cur)
		}
		cur, room = &metricdata.ResourceMetrics{Resource: rm.Resource}, max
	}
	add := func(sm metricdata.ScopeMetrics, m metricdata.Metrics) {
		n := len(cur.ScopeMetrics)
		if n == 0 || cur.ScopeMetrics[n-1].Scope != sm.Scope {
			cur.ScopeMetrics = append(cur.ScopeMetrics, metricdata.ScopeMetrics{Scope: sm.Scope})
			n++
		}
		cur.ScopeMetrics[n-1].Metrics = append(cur.ScopeMetrics[n-1].Metrics, m)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			for left := points(m.Data); ; {
				if room == 0 {
					flush()
				}
				if left <= room {
					add(sm, m)
					room -= left
					break
				}
				head, tail := cut(m, room)
				add(sm, head)
				room = 0
				m, left = tail, left-points(head.Data)
			}
		}
	}
	flush()
	if len(out) == 0 {
		out = append(out, cur) // nothing collected: one empty export, as before
	}
	return out
}

// points is the number of data points of a metric's data.
func points(d metricdata.Aggregation) int {
	switch d := d.(type) {
	case metricdata.Sum[int64]:
		return len(d.DataPoints)
	case metricdata.Sum[float64]:
		return len(d.DataPoints)
	case metricdata.Gauge[int64]:
		return len(d.DataPoints)
	case metricdata.Gauge[float64]:
		return len(d.DataPoints)
	case metricdata.Histogram[int64]:
		return len(d.DataPoints)
	case metricdata.Histogram[float64]:
		return len(d.DataPoints)
	}
	return 1 // a kind the agent does not make: sent whole
}

// cut splits m's data points at n: the first n, and the rest.
func cut(m metricdata.Metrics, n int) (head, tail metricdata.Metrics) {
	head, tail = m, m
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		h, t := d, d
		h.DataPoints, t.DataPoints = d.DataPoints[:n], d.DataPoints[n:]
		head.Data, tail.Data = h, t
	case metricdata.Sum[float64]:
		h, t := d, d
		h.DataPoints, t.DataPoints = d.DataPoints[:n], d.DataPoints[n:]
		head.Data, tail.Data = h, t
	case metricdata.Gauge[int64]:
		h, t := d, d
		h.DataPoints, t.DataPoints = d.DataPoints[:n], d.DataPoints[n:]
		head.Data, tail.Data = h, t
	case metricdata.Gauge[float64]:
		h, t := d, d
		h.DataPoints, t.DataPoints = d.DataPoints[:n], d.DataPoints[n:]
		head.Data, tail.Data = h, t
	case metricdata.Histogram[int64]:
		h, t := d, d
		h.DataPoints, t.DataPoints = d.DataPoints[:n], d.DataPoints[n:]
		head.Data, tail.Data = h, t
	case metricdata.Histogram[float64]:
		h, t := d, d
		h.DataPoints, t.DataPoints = d.DataPoints[:n], d.DataPoints[n:]
		head.Data, tail.Data = h, t
	}
	return head, tail
}
