// Command otelcol is a minimal OpenTelemetry Collector for sandboxstats'
// end-to-end tests and for checking deploy/otel/collector.yaml in CI: the
// upstream collector (go.opentelemetry.io/collector/otelcol) with only the
// components statsagent's pipelines use, all at one release (collector
// v0.165.0, pdata v1.71.0).
//
//	receivers:  otlp (gRPC and HTTP)
//	processors: batch, memory_limiter
//	exporters:  otlp_grpc (alias otlp), otlp_http (alias otlphttp), debug,
//	            jsonfile (OTLP JSON lines, which the tests read back;
//	            package jsonfile)
//	extensions: file_storage (contrib's, at the same release: the exporters'
//	            persistent sending queue, sending_queue.storage)
//
// Its own telemetry is upstream's (otelconftelemetry), so a config's
// service.telemetry section is validated as a stock collector validates it;
// configs for tests set service.telemetry.metrics.level: none, so that no
// collector listens on :8888 and several can run side by side.
//
// It lives in its own module so that the main module's ./... and go.mod do
// not carry the collector's dependencies. The command line is the
// collector's own: `otelcol --config FILE`, `otelcol validate --config FILE`,
// `otelcol components`.
package main

import (
	"fmt"
	"os"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/confmap/provider/yamlprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/debugexporter"
	"go.opentelemetry.io/collector/exporter/otlpexporter"
	"go.opentelemetry.io/collector/exporter/otlphttpexporter"
	"go.opentelemetry.io/collector/extension"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/batchprocessor"
	"go.opentelemetry.io/collector/processor/memorylimiterprocessor"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"

	"github.com/open-telemetry/opentelemetry-collector-contrib/extension/storage/filestorage"
	// The Mozilla roots (pinned by go.sum) for a TLS exporter when the
	// system has none: the image holds no CA bundle, and crypto/x509 uses
	// these only if it finds no system roots (SSL_CERT_FILE, SSL_CERT_DIR,
	// /etc/ssl/certs). A private CA: the exporter's tls.ca_file.
	_ "golang.org/x/crypto/x509roots/fallback"

	"github.com/sandboxstats/sandboxstats/e2e/otelcol/jsonfile"
)

// version is the collector release this command is built from.
const version = "0.165.0"

func main() {
	cmd := otelcol.NewCommand(otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{
			Command:     "otelcol",
			Description: "sandboxstats test collector (otlp receiver; batch, memory_limiter; otlp, otlphttp, debug, jsonfile exporters; file_storage extension)",
			Version:     version,
		},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{
					fileprovider.NewFactory(),
					envprovider.NewFactory(),
					yamlprovider.NewFactory(),
				},
			},
		},
	})
	if err := cmd.Execute(); err != nil {
		os.Exit(1) // the command printed the error
	}
}

// components returns the factories of the components this collector has.
func components() (otelcol.Factories, error) {
	var err error
	f := otelcol.Factories{Telemetry: otelconftelemetry.NewFactory()}
	if f.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return f, fmt.Errorf("receivers: %w", err)
	}
	if f.Processors, err = otelcol.MakeFactoryMap[processor.Factory](
		batchprocessor.NewFactory(), memorylimiterprocessor.NewFactory()); err != nil {
		return f, fmt.Errorf("processors: %w", err)
	}
	if f.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](
		otlpexporter.NewFactory(), otlphttpexporter.NewFactory(), debugexporter.NewFactory(), jsonfile.NewFactory()); err != nil {
		return f, fmt.Errorf("exporters: %w", err)
	}
	if f.Extensions, err = otelcol.MakeFactoryMap[extension.Factory](filestorage.NewFactory()); err != nil {
		return f, fmt.Errorf("extensions: %w", err)
	}
	return f, nil
}
