// Package grafana holds the sandboxstats dashboard (sandboxstats.json) and its
// structural test: valid panels and queries, each over a series the recording
// rules in deploy/prometheus record or statsagent exports. That every query
// evaluates against a real Prometheus is e2e's TestIntegrationPrometheusDeploy.
package grafana
