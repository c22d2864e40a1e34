package node

import (
	"fmt"
	"os/user"
	"slices"
	"strconv"
	"strings"

	"github.com/stratakv/strata/node/wire"
)

// Tenancy. Every object lives in the namespace of the Unix user that stored it,
// as the kernel reports the client's uid (SO_PEERCRED), so users that share a
// socket (--socket-mode 0660 or 0666) cannot read, remove or pre-poison each
// other's objects. Config.TenantGroups names groups of uids that share one
// namespace (every engine of a deployment). Clients running as the service's
// own user, and the groups that include it, use the empty namespace: their keys
// are stored, spilled and written through to Redis under their own names, as
// before tenancy existed.
//
// A namespace is a prefix of the service's internal key: NUL, a name, NUL. Keys
// on the wire are printable ASCII, so no client key can spell another
// namespace's prefix, and the prefix travels with the key into the spill
// directory (inside the file header, the file is named by a hash) and into Redis.

// tenants maps a client's uid to its namespace.
type tenants struct {
	self   int            // the service's own uid: the empty namespace
	groups map[int]string // uid to the prefix of its group
}

// newTenants builds the uid map from groups (each a list of uids) for a service
// running as self.
func newTenants(groups [][]int, self int) (tenants, error) {
	t := tenants{self: self, groups: map[int]string{}}
	for _, g := range groups {
		if len(g) == 0 {
			return tenants{}, fmt.Errorf("an empty tenant group: list the uids that share a namespace: %w", ErrConfig)
		}
		prefix := "\x00group:" + strconv.Itoa(slices.Min(g)) + "\x00"
		if slices.Contains(g, self) {
			prefix = ""
		}
		for _, uid := range g {
			if uid < 0 {
				return tenants{}, fmt.Errorf("tenant group %v: uid %d is negative: %w", g, uid, ErrConfig)
			}
			if _, dup := t.groups[uid]; dup {
				return tenants{}, fmt.Errorf("uid %d is in two tenant groups: a uid shares one namespace only; merge the groups: %w", uid, ErrConfig)
			}
			t.groups[uid] = prefix
		}
	}
	return t, nil
}

// namespace is the key prefix of a client with uid; a client whose uid is
// unknown (ok false) gets a namespace of its own connection id.
func (t tenants) namespace(uid int, ok bool, conn uint64) string {
	switch p, grouped := t.groups[uid]; {
	case !ok:
		return "\x00conn:" + strconv.FormatUint(conn, 10) + "\x00"
	case grouped:
		return p
	case uid == t.self:
		return ""
	default:
		return "\x00uid:" + strconv.Itoa(uid) + "\x00"
	}
}

// ParseTenantGroups reads groups written as "1000,1001;2000,alice": groups
// separated by ';', members (uids or user names) by ','. A config file's list of
// lists reaches it in this form (strata serve converts JSON values by type).
func ParseTenantGroups(v string) ([][]int, error) {
	var out [][]int
	for _, g := range strings.Split(v, ";") {
		if strings.TrimSpace(g) == "" {
			continue
		}
		var uids []int
		for _, m := range strings.Split(g, ",") {
			m = strings.TrimSpace(m)
			if m == "" {
				continue
			}
			uid, err := lookupUser(m)
			if err != nil {
				return nil, err
			}
			uids = append(uids, uid)
		}
		if len(uids) > 0 {
			out = append(out, uids)
		}
	}
	return out, nil
}

// lookupUser resolves a user name or numeric uid.
func lookupUser(u string) (int, error) {
	if id, err := strconv.Atoi(u); err == nil && id >= 0 {
		return id, nil
	}
	usr, err := user.Lookup(u)
	if err != nil {
		return 0, fmt.Errorf("tenant group member %q: %v; give a user name or a numeric uid: %w", u, err, ErrConfig)
	}
	return strconv.Atoi(usr.Uid)
}

// scope moves the keys of a request into the client's namespace. Requests are
// freshly decoded, so they are rewritten in place.
func (c *session) scope(msg wire.Message) {
	if c.ns == "" {
		return
	}
	switch m := msg.(type) {
	case *wire.Exists:
		for i, k := range m.Keys {
			m.Keys[i] = c.ns + k
		}
	case *wire.Remove:
		for i, k := range m.Keys {
			m.Keys[i] = c.ns + k
		}
	case *wire.Put:
		for i := range m.Items {
			m.Items[i].Key = c.ns + m.Items[i].Key
		}
	case *wire.Get:
		for i := range m.Items {
			m.Items[i].Key = c.ns + m.Items[i].Key
		}
	}
}

// unscope takes the client's namespace out of the results' messages, which
// name keys: the client knows its keys without it.
func (c *session) unscope(results []wire.Result) {
	if c.ns == "" {
		return
	}
	for i := range results {
		if results[i].Message != "" {
			results[i].Message = c.unscopeText(results[i].Message)
		}
	}
}

// unscopeText takes the client's namespace out of a message for it.
func (c *session) unscopeText(msg string) string {
	if c.ns == "" {
		return msg
	}
	return strings.ReplaceAll(msg, c.ns, "")
}
