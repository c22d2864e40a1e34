package pagekey

import "testing"

func TestObjectNames(t *testing.T) {
	k, err := ParseKey("34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f")
	if err != nil {
		t.Fatal(err)
	}
	const hx = "34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f"
	tests := []struct {
		names Names
		pool  string
		want  []string
	}{
		{Names{TPRank: 0}, TargetPool, []string{hx + "_0_k", hx + "_0_v"}},
		{Names{TPRank: 3}, TargetPool, []string{hx + "_3_k", hx + "_3_v"}},
		{Names{MLA: true, TPRank: 3}, TargetPool, []string{hx + "__k"}},
		{Names{TPRank: 1}, DraftPool, []string{hx + "_1_draft_k", hx + "_1_draft_v"}},
		{Names{MLA: true}, DraftPool, []string{hx + "__draft_k"}},
		{Names{ModelPrefix: "llama3-8b", TPRank: 0}, TargetPool, []string{"llama3-8b:" + hx + "_0_k", "llama3-8b:" + hx + "_0_v"}},
		{Names{TPRank: 0}, "draft2", []string{hx + "_0_draft2_k", hx + "_0_draft2_v"}},
	}
	for _, tt := range tests {
		got := tt.names.Objects(k, tt.pool)
		if len(got) != len(tt.want) {
			t.Fatalf("%+v %s: got %v", tt.names, tt.pool, got)
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%+v %s part %d = %s, want %s", tt.names, tt.pool, i, got[i], tt.want[i])
			}
		}
	}
}
