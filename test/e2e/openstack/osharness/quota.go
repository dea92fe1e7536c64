package osharness

import (
	"context"
	"fmt"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"
)

// UnlimitedQuota lifts the admin project's instances/cores/ram quota (Nova's
// default allows 10 instances and 20 cores) and returns the restore: the
// previous project values, or the defaults again if the project had no
// override.
func (h *Harness) UnlimitedQuota(ctx context.Context) (restore func() error, err error) {
	res, ok := h.Provider.GetAuthResult().(tokens.CreateResult)
	if !ok {
		return nil, fmt.Errorf("auth result %T", h.Provider.GetAuthResult())
	}
	proj, err := res.ExtractProject()
	if err != nil || proj == nil {
		return nil, fmt.Errorf("project of the token: %v", err)
	}
	path := "/os-quota-sets/" + proj.ID
	var cur, defs struct {
		QuotaSet map[string]any `json:"quota_set"`
	}
	if err := h.do(ctx, "GET", "", path, nil, &cur, 200); err != nil {
		return nil, err
	}
	if err := h.do(ctx, "GET", "", path+"/defaults", nil, &defs, 200); err != nil {
		return nil, err
	}
	set := func(ctx context.Context, q map[string]any) error {
		return h.do(ctx, "PUT", "", path, map[string]any{"quota_set": q}, nil, 200)
	}
	if err := set(ctx, map[string]any{"instances": -1, "cores": -1, "ram": -1}); err != nil {
		return nil, err
	}
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		old, same := map[string]any{}, true
		for _, k := range []string{"instances", "cores", "ram"} {
			old[k] = cur.QuotaSet[k]
			same = same && fmt.Sprint(cur.QuotaSet[k]) == fmt.Sprint(defs.QuotaSet[k])
		}
		if same { // no project override before: remove ours
			return h.do(ctx, "DELETE", "", path, nil, nil, 202, 204)
		}
		return set(ctx, old)
	}, nil
}
