-- One gradient step of a matrix factorisation R ~ U V^T on a user-item rating table.
--   tensordb factor.tdb -f sql/factor_step.sql

-- Ratings (1..5) for about a fifth of the user-item pairs: a coordinate (COO) table.
CREATE OR REPLACE TABLE ratings AS
    SELECT u AS user_id, i AS item_id, 1.0 + hash(u * 131 + i) % 5 AS rating
    FROM range(300) a(u), range(200) b(i)
    WHERE hash(u * 7 + i * 13) % 5 = 0;

-- A tensor from any query: the index columns, the value column and the shape.
CREATE OR REPLACE TENSOR R FROM (SELECT user_id, item_id, rating FROM ratings)
    INDEX (user_id, item_id) VALUE rating SHAPE (300, 200);
CREATE OR REPLACE TENSOR Mask FROM (SELECT user_id, item_id, 1.0 AS one FROM ratings)
    INDEX (user_id, item_id) VALUE one SHAPE (300, 200);
CREATE OR REPLACE TENSOR U FROM (SELECT u, f, 0.5 + 0.2 * sin(3.0 * u + f) AS v FROM range(300) r(u), range(8) s(f))
    INDEX (u, f) VALUE v SHAPE (300, 8);
CREATE OR REPLACE TENSOR V FROM (SELECT i, f, 0.5 + 0.2 * cos(5.0 * i - f) AS v FROM range(200) r(i), range(8) s(f))
    INDEX (i, f) VALUE v SHAPE (200, 8);

-- The error on observed ratings, the loss, and the gradients (with L2 regularisation).
Err[u,i] = Mask[u,i] * SUM(U[u,f] * V[i,f]) - R[u,i];
loss_before = SUM(Err[u,i] * Err[u,i]);
GU[u,f] = SUM(Err[u,i] * V[i,f]) + 0.1 * U[u,f];
GV[i,f] = SUM(Err[u,i] * U[u,f]) + 0.1 * V[i,f];

-- The step: both factors are replaced together, atomically.
BEGIN;
U[u,f] = U[u,f] - 0.002 * GU[u,f];
V[i,f] = V[i,f] - 0.002 * GV[i,f];
COMMIT;

Err[u,i] = Mask[u,i] * SUM(U[u,f] * V[i,f]) - R[u,i];
loss_after = SUM(Err[u,i] * Err[u,i]);
SELECT round(b.value, 2) AS loss_before, round(a.value, 2) AS loss_after, a.value < b.value AS improved
FROM loss_before b, loss_after a;
