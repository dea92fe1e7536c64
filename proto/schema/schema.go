// Package schema holds the JSON Schemas (draft 2020-12) of the messages
// hvguard publishes (proto/schema/v1/*.json; docs/events.md): for
// consumers in other languages, and checked against the Go encoders and
// decoders by this package's tests. Standard library only.
package schema

import "embed"

// V1 holds v1/lifecycle.json, v1/reconcile.json, v1/fence.json,
// v1/beacon.json, v1/controller-decision.json and
// v1/controller-recovery.json. Each names itself by its $id
// (urn:hvguard:schema:v1:<name>); reconcile.json refers to
// lifecycle.json's definitions by that id.
//
//go:embed v1/*.json
var V1 embed.FS

// Files maps each schema's $id to its file in V1.
var Files = map[string]string{
	"urn:hvguard:schema:v1:lifecycle":           "v1/lifecycle.json",
	"urn:hvguard:schema:v1:reconcile":           "v1/reconcile.json",
	"urn:hvguard:schema:v1:fence":               "v1/fence.json",
	"urn:hvguard:schema:v1:beacon":              "v1/beacon.json",
	"urn:hvguard:schema:v1:controller-decision": "v1/controller-decision.json",
	"urn:hvguard:schema:v1:controller-recovery": "v1/controller-recovery.json",
}
