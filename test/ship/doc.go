// Package ship holds the tests of what kvroute ships: dist/install.yaml (current with
// config/default, applies to a real kube-apiserver, RBAC neither short nor wide), the OLM bundle
// (current, valid under operator-framework/api's validators), the Argo CD health check, the
// Prometheus assets (every metric they name exists) and the generated configuration reference.
package ship
