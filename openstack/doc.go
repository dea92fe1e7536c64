// Package openstack is hvguard's OpenStack client, built on gophercloud
// v2: Nova for rejoin reconciliation and stop classification (Client),
// Nova, Cinder and Masakari for recovery (Recovery).
//
// Configuration is clouds.yaml (and secure.yaml) read by gophercloud's own
// loader (openstack/config/clouds), the way the openstack CLI reads it:
// Config names the cloud and may override region, interface and CA bundle;
// OS_CLOUD-style environment variables that the loader honours
// (OS_REGION_NAME, OS_INTERFACE, OS_CACERT, OS_CLIENT_CONFIG_FILE) apply as
// for any OpenStack tool. New parses the file and fails on configuration
// errors; it does not contact keystone. The first call authenticates; the
// token is reused, renewed tokenRenewBefore its expiry, and gophercloud
// re-authenticates once on a 401 (AllowReauth).
//
// Every compute request pins Microversion (2.59) and the answer must echo
// it. Calls:
//
//   - ListEvacuationsFrom(ctx, host): GET /os-migrations?source_compute=
//     <host>&migration_type=evacuation&limit=PageSize, following Nova's
//     next links with marker = the last record's uuid. No status filter
//     (single-valued: a repeated status keeps only the last value; a comma
//     list matches nothing) and no host filter (matches source OR
//     destination and overrides source_compute). All pages or an error.
//   - ServerHosts(ctx, uuids): GET /servers/{uuid} per candidate, up to
//     lookupConcurrency in flight; a 404 with Nova's itemNotFound body is an
//     answer (Found=false), anything else that fails fails the call.
//   - ServersOnHost(ctx, host) (servers.go, for stop classification):
//     GET /servers/detail?all_tenants=1&host=<host>&limit=PageSize, paged
//     by servers_links; every record's host must be host. ServersOn wraps
//     it as lookups for the reconcile runner's destination listings.
//   - InstanceActions(ctx, uuid): GET /servers/{uuid}/os-instance-actions?
//     limit=MaxActions, newest first; a null user_id is Nova itself.
//     ClassifyServers and ClassifyActions map both answers onto package
//     classify's values (the agent and the contract tests share them).
//
// Decoding is strict (fields, types, null vs absent, duplicate keys,
// trailing data, body and page caps); a failure is never a default value
// and never a partial result. Errors are *Error with a Kind separating
// "Nova is not there" (Unavailable: unreachable, timeout, 5xx, auth) from
// "Nova said no" (rejected, not found) and "the answer is unusable"
// (malformed, too large); Error.ReconcileReason maps them onto
// reconcile's global reasons.
//
// Recovery (recovery*.go) is the adapter the controller's host recovery
// (issue 13) and instance recovery (issue 14) call: NewRecovery(
// RecoveryConfig{Config, ServiceCloud}) shares the admin token of a Client
// among Nova, Cinder (block-storage v3) and Masakari (instance-ha), and
// keeps a second token for the service-role user (ServiceCloud) that only
// ever travels as X-Service-Token on Cinder attachment deletes. Calls and
// microversions (each answer must echo it):
//
//   - Service(host), ForceDown(host, down): GET /os-services?binary=
//     nova-compute&host=, PUT /os-services/{uuid} {"forced_down"} at 2.53;
//     clearing it while `done` evacuations remain → ErrDoneEvacuations.
//   - HostServers(host), Server(id): servers/detail (all_tenants, paged) and
//     GET /servers/{id} at 2.59: state, metadata, attached volumes,
//     boot-from-volume (image "").
//   - Evacuate(id): {"evacuate": {}} at min(Nova's max, 2.94) ≥ 2.14 (from
//     2.95 the server would be left stopped); Migrations(host, since):
//     ListEvacuationsFrom filtered by created_at.
//   - Start(id), HardReboot(id): os-start, reboot HARD at 2.59.
//   - Volume(id), RemoveAttachment(volume, attachment, expectHost): GET
//     /volumes/{id} and DELETE /attachments/{id} (X-Service-Token) at
//     3.44; refuses an attachment whose host_name is not expectHost.
//   - HostNotification(host, at), InstanceNotification(VMNotification),
//     Notification(id): Masakari notifications at API 1.0.
//
// openstacktest replays responses recorded from a real Nova 26.2.2
// (testdata/) for contract tests; e2e_test.go (build tag e2e) runs against
// the real harness of test/e2e/openstack.
package openstack
