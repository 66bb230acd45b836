// Package logtelemetry is the collector's own telemetry reduced to its log:
// a service.telemetry factory that writes the collector's log to stderr
// and serves no internal metrics or traces. It replaces upstream's
// otelconftelemetry, whose resource detectors (AWS, GCP, Azure, EKS with
// Kubernetes' API types) and SDK exporters make a cold build of this
// collector about four times longer (about 7 minutes instead of under 2 on
// two cores).
//
// Its configuration is a subset of otelconftelemetry's, with the same keys
// and rules, so a service.telemetry section it accepts is accepted by a
// stock collector too:
//
//	service:
//	  telemetry:
//	    logs:
//	      level: info        # debug, info, warn, error
//	      encoding: console  # or json
//	    metrics:
//	      level: none        # basic, normal, detailed need readers
//	      readers: [...]     # accepted unchecked: this build serves none
package logtelemetry

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/configtelemetry"
	"go.opentelemetry.io/collector/service/telemetry"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Config is the service.telemetry section.
type Config struct {
	Logs    LogsConfig    `mapstructure:"logs"`
	Metrics MetricsConfig `mapstructure:"metrics"`
}

// LogsConfig is service.telemetry.logs.
type LogsConfig struct {
	// Level is the lowest level logged.
	Level zapcore.Level `mapstructure:"level"`
	// Encoding is "console" or "json".
	Encoding string `mapstructure:"encoding"`
}

// MetricsConfig is service.telemetry.metrics. This build serves no internal
// metrics whatever the level.
type MetricsConfig struct {
	// Level is the verbosity of the internal metrics; above none a stock
	// collector needs Readers.
	Level configtelemetry.Level `mapstructure:"level"`
	// Readers are otelconf metric readers, kept for configs shared with a
	// stock collector and not checked.
	Readers []map[string]any `mapstructure:"readers"`
}

// Validate applies otelconftelemetry's rules to the keys this package has.
func (c *Config) Validate() error {
	if c.Logs.Encoding != "console" && c.Logs.Encoding != "json" {
		return fmt.Errorf("logtelemetry: logs encoding %q: want console or json", c.Logs.Encoding)
	}
	if c.Metrics.Level != configtelemetry.LevelNone && len(c.Metrics.Readers) == 0 {
		return errors.New("logtelemetry: collector telemetry metrics reader should exist when metric level is not none")
	}
	return nil
}

// NewFactory returns the telemetry factory: a zap logger to stderr, no-op
// meter and tracer providers.
func NewFactory() telemetry.Factory {
	return telemetry.NewFactory(
		func() component.Config {
			return &Config{
				Logs:    LogsConfig{Level: zapcore.InfoLevel, Encoding: "console"},
				Metrics: MetricsConfig{Level: configtelemetry.LevelNone},
			}
		},
		telemetry.WithCreateLogger(createLogger),
	)
}

// createLogger builds the logger as otelconftelemetry does (zap's
// production config, ISO 8601 times) without its OpenTelemetry log tee.
func createLogger(_ context.Context, set telemetry.LoggerSettings, cfg component.Config) (*zap.Logger, component.ShutdownFunc, error) {
	c := cfg.(*Config)
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	zc := zap.Config{
		Level:            zap.NewAtomicLevelAt(c.Logs.Level),
		Encoding:         c.Logs.Encoding,
		EncoderConfig:    ec,
		OutputPaths:      []string{"stderr"},
		ErrorOutputPaths: []string{"stderr"},
	}
	build := set.BuildZapLogger
	if build == nil {
		build = zap.Config.Build
	}
	logger, err := build(zc)
	if err != nil {
		return nil, nil, fmt.Errorf("logtelemetry: %w", err)
	}
	return logger, func(context.Context) error { _ = logger.Sync(); return nil }, nil
}
