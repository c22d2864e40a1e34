package node

import (
	"fmt"
	"os/user"
	"strconv"
)

// lookupGroup resolves a group name or numeric id.
func lookupGroup(g string) (int, error) {
	if id, err := strconv.Atoi(g); err == nil && id >= 0 {
		return id, nil
	}
	grp, err := user.LookupGroup(g)
	if err != nil {
		return 0, fmt.Errorf("socket group %q: %v: %w", g, err, ErrConfig)
	}
	return strconv.Atoi(grp.Gid)
}
