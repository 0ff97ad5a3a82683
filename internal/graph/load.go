package graph

import (
	"context"

	"github.com/deptrace/deptrace/internal/store"
)

// Load builds the graph of range r from a store: what look, graph, diff and
// the web API all show, so that whatever makes the store's queries faster
// makes every one of them faster.
func Load(ctx context.Context, st *store.Store, r store.Range) (Graph, []store.Host, error) {
	obs, err := st.Observations(ctx, r)
	if err != nil {
		return Graph{}, nil, err
	}
	hosts, err := st.Hosts(ctx)
	if err != nil {
		return Graph{}, nil, err
	}
	listeners, err := st.Listeners(ctx, r)
	if err != nil {
		return Graph{}, nil, err
	}
	ids, err := st.Identities(ctx, r)
	if err != nil {
		return Graph{}, nil, err
	}
	dns, err := st.DNS(ctx, r)
	if err != nil {
		return Graph{}, nil, err
	}
	g := Build(obs, hosts, listeners)
	AddDNS(&g, dns, hosts)
	Name(&g, ids)
	return g, hosts, nil
}
