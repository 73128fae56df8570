-- Scaled dot-product attention with a softmax built from MAX, EXP and SUM steps.
--   tensordb attn.tdb -f sql/attention.sql

CREATE OR REPLACE TENSOR Q FROM (
    SELECT q, d, sin(0.5 * q + 0.3 * d) AS v FROM range(128) r(q), range(64) s(d)
) INDEX (q, d) VALUE v SHAPE (128, 64);
CREATE OR REPLACE TENSOR K FROM (
    SELECT k, d, cos(0.2 * k - 0.7 * d) AS v FROM range(256) r(k), range(64) s(d)
) INDEX (k, d) VALUE v SHAPE (256, 64);
CREATE OR REPLACE TENSOR V FROM (
    SELECT k, e, sin(0.05 * k * e) AS v FROM range(256) r(k), range(32) s(e)
) INDEX (k, e) VALUE v SHAPE (256, 32);

-- scores, then a numerically stable softmax over the keys: subtract the row maximum first.
-- The maximum uses a label of its own (j), so MAX aggregates j and keeps q.
S[q,k] = SUM(Q[q,d] * K[k,d]) / 8;                  -- 8 = sqrt(64)
LET E[q,k] = EXP(S[q,k] - MAX(S[q,j]));
P[q,k] = E[q,k] / SUM(E[q,j]);
O[q,e] = SUM(P[q,k] * V[k,e]);

-- every row of P sums to 1
SELECT round(min(s), 6) AS min_row_sum, round(max(s), 6) AS max_row_sum
FROM (SELECT q, sum(value) AS s FROM P GROUP BY q);
SELECT q, e, round(value, 4) AS value FROM O WHERE q < 2 AND e < 3 ORDER BY q, e;
