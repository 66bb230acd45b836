package peercred

import "testing"

func FuzzParseGroups(f *testing.F) {
	for _, s := range []string{"Groups:\t4 24 27\n", "Groups:\n", "", "Groups: 99999999999\n", "Uid:\t0\nGroups:\t0\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if gs, err := parseGroups(b); err != nil && gs != nil {
			t.Fatalf("groups %v with error %v", gs, err)
		}
	})
}

func FuzzParseIDs(f *testing.F) {
	for _, s := range []string{"0", "0,1000", " 5 ,", "x", "4294967296"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := ParseIDs(s)
		if err != nil && ids != nil {
			t.Fatalf("ids %v with error %v", ids, err)
		}
	})
}
