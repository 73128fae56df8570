-- One matrix factorisation R ~ U V^T trained on a sparse ratings matrix with GRAD: 10 steps of
-- gradient descent on the squared error over the OBSERVED ratings only, plus L2 terms.
--   tensordb mf.tdb -f sql/train_mf.sql
-- The sparsity is managed relationally: the observed entries of R are numbered in SQL, one row
-- per rating, and the model reads U's and V's rows at them (gathers). So the residual is a
-- vector of one value per rating (an SDDMM: the dot products of U's and V's rows only at R's
-- entries) and the gradients are scatter-adds of it (SpMM with the one-hot rows of the index,
-- sparse): nothing of size users x items is ever computed. EXPLAIN of a step shows it.
SET quiet = on;

-- Ratings (1..5) for about 2% of 300 users x 200 items: a coordinate (COO) table, and R, the
-- same ratings as a tensor (stored sparse).
CREATE OR REPLACE TABLE ratings AS
    SELECT u AS user_id, i AS item_id, 1.0 + hash(u * 131 + i) % 5 AS rating
    FROM range(300) a(u), range(200) b(i)
    WHERE hash(u * 7 + i * 13) % 50 = 0;
CREATE OR REPLACE TENSOR R FROM (SELECT user_id, item_id, rating FROM ratings)
    INDEX (user_id, item_id) VALUE rating SHAPE (300, 200);

-- The observed entries, numbered n = 0, 1, ...: read from R's nonzeros (SELECT * FROM R yields
-- them), as three vectors: the user, the item and the rating of observation n.
CREATE OR REPLACE TABLE obs AS
    SELECT (row_number() OVER (ORDER BY user_id, item_id) - 1) AS n, user_id, item_id, value
    FROM R;
CREATE OR REPLACE TENSOR obs_user FROM (SELECT n, user_id FROM obs) INDEX (n) VALUE user_id;
CREATE OR REPLACE TENSOR obs_item FROM (SELECT n, item_id FROM obs) INDEX (n) VALUE item_id;
CREATE OR REPLACE TENSOR obs_rating FROM (SELECT n, value FROM obs) INDEX (n) VALUE value;

-- The factors, rank 8: deterministic values near 0.5.
CREATE OR REPLACE TENSOR U FROM (
    SELECT u, f, 0.5 + 0.2 * sin(3.0 * u + f) AS v FROM range(300) r(u), range(8) s(f)
) INDEX (u, f) VALUE v SHAPE (300, 8);
CREATE OR REPLACE TENSOR V FROM (
    SELECT i, f, 0.5 + 0.2 * cos(5.0 * i - f) AS v FROM range(200) r(i), range(8) s(f)
) INDEX (i, f) VALUE v SHAPE (200, 8);

-- The residual at the observed entries (an SDDMM), as a LET: computed with the factors of the
-- moment it is used, never stored.
LET Resid[n] = SUM(U[obs_user[n], f] * V[obs_item[n], f]) - obs_rating[n];
CREATE OR REPLACE TABLE loss_curve (step INTEGER, loss DOUBLE);

-- step 1
L = SUM(Resid[n] * Resid[n]) + 0.1 * SUM(U[u,f] * U[u,f]) + 0.1 * SUM(V[i,f] * V[i,f]);
LET dU = GRAD(L, U); LET dV = GRAD(L, V);
U[u,f] = U[u,f] - 0.02 * dU[u,f];
V[i,f] = V[i,f] - 0.02 * dV[i,f];
INSERT INTO loss_curve SELECT 1, value FROM L;

-- step 2
L = SUM(Resid[n] * Resid[n]) + 0.1 * SUM(U[u,f] * U[u,f]) + 0.1 * SUM(V[i,f] * V[i,f]);
LET dU = GRAD(L, U); LET dV = GRAD(L, V);
U[u,f] = U[u,f] - 0.02 * dU[u,f];
V[i,f] = V[i,f] - 0.02 * dV[i,f];
INSERT INTO loss_curve SELECT 2, value FROM L;

-- step 3
L = SUM(Resid[n] * Resid[n]) + 0.1 * SUM(U[u,f] * U[u,f]) + 0.1 * SUM(V[i,f] * V[i,f]);
LET dU = GRAD(L, U); LET dV = GRAD(L, V);
U[u,f] = U[u,f] - 0.02 * dU[u,f];
V[i,f] = V[i,f] - 0.02 * dV[i,f];
INSERT INTO loss_curve SELECT 3, value FROM L;

-- step 4
L = SUM(Resid[n] * Resid[n]) + 0.1 * SUM(U[u,f] * U[u,f]) + 0.1 * SUM(V[i,f] * V[i,f]);
LET dU = GRAD(L, U); LET dV = GRAD(L, V);
U[u,f] = U[u,f] - 0.02 * dU[u,f];
V[i,f] = V[i,f] - 0.02 * dV[i,f];
INSERT INTO loss_curve SELECT 4, value FROM L;

-- step 5
L = SUM(Resid[n] * Resid[n]) + 0.1 * SUM(U[u,f] * U[u,f]) + 0.1 * SUM(V[i,f] * V[i,f]);
LET dU = GRAD(L, U); LET dV = GRAD(L, V);
U[u,f] = U[u,f] - 0.02 * dU[u,f];
V[i,f] = V[i,f] - 0.02 * dV[i,f];
INSERT INTO loss_curve SELECT 5, value FROM L;

-- step 6
L = SUM(Resid[n] * Resid[n]) + 0.1 * SUM(U[u,f] * U[u,f]) + 0.1 * SUM(V[i,f] * V[i,f]);
LET dU = GRAD(L, U); LET dV = GRAD(L, V);
U[u,f] = U[u,f] - 0.02 * dU[u,f];
V[i,f] = V[i,f] - 0.02 * dV[i,f];
INSERT INTO loss_curve SELECT 6, value FROM L;

-- step 7
L = SUM(Resid[n] * Resid[n]) + 0.1 * SUM(U[u,f] * U[u,f]) + 0.1 * SUM(V[i,f] * V[i,f]);
LET dU = GRAD(L, U); LET dV = GRAD(L, V);
U[u,f] = U[u,f] - 0.02 * dU[u,f];
V[i,f] = V[i,f] - 0.02 * dV[i,f];
INSERT INTO loss_curve SELECT 7, value FROM L;

-- step 8
L = SUM(Resid[n] * Resid[n]) + 0.1 * SUM(U[u,f] * U[u,f]) + 0.1 * SUM(V[i,f] * V[i,f]);
LET dU = GRAD(L, U); LET dV = GRAD(L, V);
U[u,f] = U[u,f] - 0.02 * dU[u,f];
V[i,f] = V[i,f] - 0.02 * dV[i,f];
INSERT INTO loss_curve SELECT 8, value FROM L;

-- step 9
L = SUM(Resid[n] * Resid[n]) + 0.1 * SUM(U[u,f] * U[u,f]) + 0.1 * SUM(V[i,f] * V[i,f]);
LET dU = GRAD(L, U); LET dV = GRAD(L, V);
U[u,f] = U[u,f] - 0.02 * dU[u,f];
V[i,f] = V[i,f] - 0.02 * dV[i,f];
INSERT INTO loss_curve SELECT 9, value FROM L;

-- step 10
L = SUM(Resid[n] * Resid[n]) + 0.1 * SUM(U[u,f] * U[u,f]) + 0.1 * SUM(V[i,f] * V[i,f]);
LET dU = GRAD(L, U); LET dV = GRAD(L, V);
U[u,f] = U[u,f] - 0.02 * dU[u,f];
V[i,f] = V[i,f] - 0.02 * dV[i,f];
INSERT INTO loss_curve SELECT 10, value FROM L;

-- The loss curve (the loss before each step's update).
SELECT step, round(loss, 6) AS loss FROM loss_curve ORDER BY step;
