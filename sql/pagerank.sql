-- PageRank by power iteration, as networkx computes it (damping 0.85, the rank of nodes with no
-- out-edge spread evenly over all nodes):
--   r[i] <- 0.85 * (SUM_j M[i,j] * r[j] + SUM_j dangling[j] * r[j] / n) + 0.15 / n
-- where M[i,j] = 1 / outdegree(j) for an edge j -> i: a sparse matrix, so the step's product is
-- a sparse-times-dense kernel (SpMV), planned once and cached from the second step on.
--   tensordb pr.tdb -f sql/pagerank.sql
-- The dialect has no loop: below, 12 steps are written out, each a group of three statements (the new ranks,
-- their l1 change, the ranks replaced).
-- To run to convergence, send the step from Python until pr_err < n * 1e-6 (networkx's test):
--     while True:
--         con.execute(STEP)               # the three statements of one step
--         if float(con.tensor("pr_err")) < 64 * 1e-6: break
-- (tests/sparse/test_pagerank.py checks that against networkx.pagerank; the benchmark
-- tests/bench/bench_sparse_scale.py runs it on a million-node graph.)

SET quiet = on;

-- A directed graph on 64 nodes: each node i links to i+1 and to (5i + 3) mod 64, and nodes
-- that are multiples of 9 have no out-edges (dangling).
CREATE OR REPLACE TABLE pr_edges AS
    SELECT i AS src, (i + 1) % 64 AS dst FROM range(64) r(i) WHERE i % 9 <> 0
    UNION
    SELECT i, (5 * i + 3) % 64 FROM range(64) r(i) WHERE i % 9 <> 0 AND (5 * i + 3) % 64 <> i;

-- M[i,j] = 1 / outdegree(j) for an edge j -> i (stored sparse: its tiles hold its entries)
CREATE OR REPLACE TENSOR pr_M FROM (
    SELECT dst AS i, src AS j, 1.0 / count(*) OVER (PARTITION BY src) AS v FROM pr_edges
) INDEX (i, j) VALUE v SHAPE (64, 64);
-- 1 for the dangling nodes; the ranks start even
CREATE OR REPLACE TENSOR pr_dangling FROM (
    SELECT i, 1.0 AS v FROM range(64) r(i) WHERE i NOT IN (SELECT src FROM pr_edges)
) INDEX (i) VALUE v SHAPE (64);
CREATE OR REPLACE TENSOR pr_r FROM (SELECT i, 1.0 / 64 AS v FROM range(64) r(i))
    INDEX (i) VALUE v SHAPE (64);

-- step 1
pr_rn[i] = 0.85 * (SUM(pr_M[i,j] * pr_r[j]) + SUM(pr_dangling[j] * pr_r[j]) / 64) + 0.15 / 64;
pr_err = SUM(ABS(pr_rn[i] - pr_r[i]));
pr_r[i] = pr_rn[i];
-- step 2
pr_rn[i] = 0.85 * (SUM(pr_M[i,j] * pr_r[j]) + SUM(pr_dangling[j] * pr_r[j]) / 64) + 0.15 / 64;
pr_err = SUM(ABS(pr_rn[i] - pr_r[i]));
pr_r[i] = pr_rn[i];
-- step 3
pr_rn[i] = 0.85 * (SUM(pr_M[i,j] * pr_r[j]) + SUM(pr_dangling[j] * pr_r[j]) / 64) + 0.15 / 64;
pr_err = SUM(ABS(pr_rn[i] - pr_r[i]));
pr_r[i] = pr_rn[i];
-- step 4
pr_rn[i] = 0.85 * (SUM(pr_M[i,j] * pr_r[j]) + SUM(pr_dangling[j] * pr_r[j]) / 64) + 0.15 / 64;
pr_err = SUM(ABS(pr_rn[i] - pr_r[i]));
pr_r[i] = pr_rn[i];
-- step 5
pr_rn[i] = 0.85 * (SUM(pr_M[i,j] * pr_r[j]) + SUM(pr_dangling[j] * pr_r[j]) / 64) + 0.15 / 64;
pr_err = SUM(ABS(pr_rn[i] - pr_r[i]));
pr_r[i] = pr_rn[i];
-- step 6
pr_rn[i] = 0.85 * (SUM(pr_M[i,j] * pr_r[j]) + SUM(pr_dangling[j] * pr_r[j]) / 64) + 0.15 / 64;
pr_err = SUM(ABS(pr_rn[i] - pr_r[i]));
pr_r[i] = pr_rn[i];
-- step 7
pr_rn[i] = 0.85 * (SUM(pr_M[i,j] * pr_r[j]) + SUM(pr_dangling[j] * pr_r[j]) / 64) + 0.15 / 64;
pr_err = SUM(ABS(pr_rn[i] - pr_r[i]));
pr_r[i] = pr_rn[i];
-- step 8
pr_rn[i] = 0.85 * (SUM(pr_M[i,j] * pr_r[j]) + SUM(pr_dangling[j] * pr_r[j]) / 64) + 0.15 / 64;
pr_err = SUM(ABS(pr_rn[i] - pr_r[i]));
pr_r[i] = pr_rn[i];
-- step 9
pr_rn[i] = 0.85 * (SUM(pr_M[i,j] * pr_r[j]) + SUM(pr_dangling[j] * pr_r[j]) / 64) + 0.15 / 64;
pr_err = SUM(ABS(pr_rn[i] - pr_r[i]));
pr_r[i] = pr_rn[i];
-- step 10
pr_rn[i] = 0.85 * (SUM(pr_M[i,j] * pr_r[j]) + SUM(pr_dangling[j] * pr_r[j]) / 64) + 0.15 / 64;
pr_err = SUM(ABS(pr_rn[i] - pr_r[i]));
pr_r[i] = pr_rn[i];
-- step 11
pr_rn[i] = 0.85 * (SUM(pr_M[i,j] * pr_r[j]) + SUM(pr_dangling[j] * pr_r[j]) / 64) + 0.15 / 64;
pr_err = SUM(ABS(pr_rn[i] - pr_r[i]));
pr_r[i] = pr_rn[i];
-- step 12
pr_rn[i] = 0.85 * (SUM(pr_M[i,j] * pr_r[j]) + SUM(pr_dangling[j] * pr_r[j]) / 64) + 0.15 / 64;
pr_err = SUM(ABS(pr_rn[i] - pr_r[i]));
pr_r[i] = pr_rn[i];

-- the l1 change of the last step, and the five highest ranks
SELECT round(value, 6) AS last_change FROM pr_err;
SELECT i AS node, round(value, 5) AS rank FROM pr_r ORDER BY value DESC, i LIMIT 5;
