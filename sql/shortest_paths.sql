-- All-pairs shortest paths by repeated min-plus squaring: D[i,j] = MIN(D[i,k] + D[k,j]).
--   tensordb paths.tdb -f sql/shortest_paths.sql

-- A weighted graph on 64 nodes: a ring (so it is connected) plus some chords.
CREATE OR REPLACE TABLE edges AS
    SELECT i AS src, (i + 1) % 64 AS dst, 1.0 + (i % 5) AS w FROM range(64) r(i)
    UNION ALL
    SELECT i, (i * 7 + 3) % 64, 2.0 + (i % 3) FROM range(64) r(i) WHERE (i * 7 + 3) % 64 <> i;

-- The distance matrix: 0 on the diagonal, the lightest edge, else "infinity" (1e9).
CREATE OR REPLACE TENSOR D FROM (
    SELECT i, j, CASE WHEN i = j THEN 0.0 ELSE coalesce(min(w), 1e9) END AS d
    FROM range(64) r(i) CROSS JOIN range(64) s(j) LEFT JOIN edges ON src = i AND dst = j
    GROUP BY i, j
) INDEX (i, j) VALUE d SHAPE (64, 64);

-- Paths of up to 2^6 = 64 edges: six squarings, sent together and planned as one graph.
-- Each assignment replaces D; the intermediate versions are never stored.
D[i,j] = MIN(D[i,k] + D[k,j]);
D[i,j] = MIN(D[i,k] + D[k,j]);
D[i,j] = MIN(D[i,k] + D[k,j]);
D[i,j] = MIN(D[i,k] + D[k,j]);
D[i,j] = MIN(D[i,k] + D[k,j]);
D[i,j] = MIN(D[i,k] + D[k,j]);

SELECT max(value) AS diameter, round(avg(value), 3) AS mean_distance, count(*) AS reachable_pairs
FROM D;
SELECT j AS node, value AS distance_from_0 FROM D WHERE i = 0 ORDER BY j LIMIT 8;
