package nodeagent

import (
	"math"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
)

// appendText appends f in the text format 0.0.4, the bytes expfmt's text
// encoder writes for it (MetricFamilyToText after its escaping of names,
// a no-op for legacy names), or returns false when f is not one it writes
// alike: a name or label name outside the legacy charset, a __name__
// label (escaping may rewrite its value), a family without
// metrics or a metric without its type's value. The sweep's families are
// encoded once per sweep; expfmt's encoder checked every metric's names
// twice (its escaping, then writing them) and replaced through a
// strings.Replacer: 43% of a 1000-workload sweep's first scrape. legal
// caches label names found legal, for the families of one body.
func appendText(dst []byte, f *dto.MetricFamily, legal map[string]bool) ([]byte, bool) {
	name := f.GetName()
	if len(f.Metric) == 0 || !legacyName(name, legal) {
		return dst, false
	}
	if f.Help != nil {
		dst = append(dst, "# HELP "...)
		dst = append(dst, name...)
		dst = append(dst, ' ')
		dst = appendEscaped(dst, f.GetHelp(), false)
		dst = append(dst, '\n')
	}
	dst = append(dst, "# TYPE "...)
	dst = append(dst, name...)
	typ := f.GetType()
	switch typ {
	case dto.MetricType_COUNTER:
		dst = append(dst, " counter\n"...)
	case dto.MetricType_GAUGE:
		dst = append(dst, " gauge\n"...)
	case dto.MetricType_SUMMARY:
		dst = append(dst, " summary\n"...)
	case dto.MetricType_UNTYPED:
		dst = append(dst, " untyped\n"...)
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
		dst = append(dst, " histogram\n"...)
	default:
		return dst, false
	}
	var ok bool
	var prev []*dto.LabelPair // the last metric's labels, checked
	for _, m := range f.Metric {
		for i, lp := range m.Label {
			// A family's metrics mostly share their label names (the same
			// strings): compared with the last metric's, looked up if not.
			if i < len(prev) && prev[i].GetName() == lp.GetName() {
				continue
			}
			if lp.GetName() == model.MetricNameLabel || !legacyName(lp.GetName(), legal) {
				return dst, false
			}
		}
		prev = m.Label
		sample := func(suffix, extra string, extraValue, v float64) {
			dst = appendSample(dst, name, suffix, m, extra, extraValue, v)
		}
		switch typ {
		case dto.MetricType_COUNTER:
			if ok = m.Counter != nil; ok {
				sample("", "", 0, m.Counter.GetValue())
			}
		case dto.MetricType_GAUGE:
			if ok = m.Gauge != nil; ok {
				sample("", "", 0, m.Gauge.GetValue())
			}
		case dto.MetricType_UNTYPED:
			if ok = m.Untyped != nil; ok {
				sample("", "", 0, m.Untyped.GetValue())
			}
		case dto.MetricType_SUMMARY:
			if ok = m.Summary != nil; ok {
				for _, q := range m.Summary.Quantile {
					sample("", model.QuantileLabel, q.GetQuantile(), q.GetValue())
				}
				sample("_sum", "", 0, m.Summary.GetSampleSum())
				sample("_count", "", 0, float64(m.Summary.GetSampleCount()))
			}
		default: // histograms
			h := m.Histogram
			if ok = h != nil; ok {
				infSeen := false
				for _, b := range h.Bucket {
					v := b.GetCumulativeCountFloat()
					if v == 0 {
						v = float64(b.GetCumulativeCount())
					}
					sample("_bucket", model.BucketLabel, b.GetUpperBound(), v)
					infSeen = infSeen || math.IsInf(b.GetUpperBound(), +1)
				}
				count := h.GetSampleCountFloat()
				if count == 0 {
					count = float64(h.GetSampleCount())
				}
				if !infSeen {
					sample("_bucket", model.BucketLabel, math.Inf(+1), count)
				}
				sample("_sum", "", 0, h.GetSampleSum())
				sample("_count", "", 0, count)
			}
		}
		if !ok {
			return dst, false
		}
	}
	return dst, true
}

// legacyName reports whether s is a legacy metric or label name (expfmt
// writes it bare), remembering the answer in legal.
func legacyName(s string, legal map[string]bool) bool {
	v, seen := legal[s]
	if !seen {
		v = model.LegacyValidation.IsValidMetricName(s)
		legal[s] = v
	}
	return v
}

func appendSample(dst []byte, name, suffix string, m *dto.Metric, extra string, extraValue, v float64) []byte {
	dst = append(dst, name...)
	dst = append(dst, suffix...)
	sep := byte('{')
	for _, lp := range m.Label {
		dst = append(dst, sep)
		dst = append(dst, lp.GetName()...)
		dst = append(dst, `="`...)
		dst = appendEscaped(dst, lp.GetValue(), true)
		dst = append(dst, '"')
		sep = ','
	}
	if extra != "" {
		dst = append(dst, sep)
		dst = append(dst, extra...)
		dst = append(dst, `="`...)
		dst = appendFloat(dst, extraValue)
		dst = append(dst, '"')
		sep = ','
	}
	if sep == ',' {
		dst = append(dst, '}')
	}
	dst = append(dst, ' ')
	dst = appendFloat(dst, v)
	if m.TimestampMs != nil {
		dst = append(dst, ' ')
		dst = strconv.AppendInt(dst, m.GetTimestampMs(), 10)
	}
	return append(dst, '\n')
}

// appendEscaped escapes as expfmt does: backslash and newline, and the
// double quote in a label value.
func appendEscaped(dst []byte, s string, quote bool) []byte {
	special := "\\\n"
	if quote {
		special = "\\\n\""
	}
	for {
		i := strings.IndexAny(s, special)
		if i < 0 {
			return append(dst, s...)
		}
		dst = append(dst, s[:i]...)
		switch s[i] {
		case '\\':
			dst = append(dst, `\\`...)
		case '\n':
			dst = append(dst, `\n`...)
		default:
			dst = append(dst, `\"`...)
		}
		s = s[i+1:]
	}
}

// appendFloat formats as expfmt's writeFloat.
func appendFloat(dst []byte, f float64) []byte {
	switch {
	case f == 1:
		return append(dst, '1')
	case f == 0:
		return append(dst, '0')
	case f == -1:
		return append(dst, "-1"...)
	case math.IsNaN(f):
		return append(dst, "NaN"...)
	case math.IsInf(f, +1):
		return append(dst, "+Inf"...)
	case math.IsInf(f, -1):
		return append(dst, "-Inf"...)
	}
	return strconv.AppendFloat(dst, f, 'g', -1, 64)
}
