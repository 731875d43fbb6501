"""MTP (NextN) speculative decoding pieces for GLM-DSA: recycling policy, top-k share across draft
steps (with compaction to each request's last accepted token), acceptance statistics, start-up
checks of the MTP flags."""
