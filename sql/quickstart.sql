-- tensordb quickstart:   tensordb quickstart.tdb -f sql/quickstart.sql
-- Everything here is generated with SQL, so it runs anywhere; it can be run again (OR REPLACE).

-- 1. Tensors from SQL queries: one row per element, index columns plus a value column.
CREATE OR REPLACE TENSOR A FROM (
    SELECT i, j, sin(0.1 * i + 0.03 * j) AS v FROM range(512) r(i), range(256) s(j)
) INDEX (i, j) VALUE v SHAPE (512, 256);
CREATE OR REPLACE TENSOR B FROM (
    SELECT j, k, cos(0.05 * j - 0.02 * k) AS v FROM range(256) r(j), range(128) s(k)
) INDEX (j, k) VALUE v SHAPE (256, 128);
CREATE OR REPLACE TENSOR bias (k 128) FLOAT64;      -- zeros: nothing is stored
SHOW TENSORS;

-- 2. Einsum queries in index notation: a label that is not on the left is aggregated.
C[i,k] = SUM(A[i,j] * B[j,k]);                     -- a matrix product (j is summed)
H[i,k] = RELU(C[i,k] + bias[k]);                    -- elementwise, with a broadcast
M[i] = MAX(H[i,k]);                                 -- row maxima
total = SUM(C[i,k] * C[i,k]);                       -- a scalar: the squared Frobenius norm
Ct = EINSUM('ik->ki', C);                           -- numpy's einsum, exactly

-- 3. How is a query cut into tiles, and what does it cost?
EXPLAIN C[i,k] = A[i,j] * B[j,k];

-- 4. Tensors are relations: one column per dimension, plus value (zeros are absent).
SELECT i, round(value, 3) AS row_max FROM M ORDER BY value DESC, i LIMIT 5;
SELECT count(*) AS nonzeros, round(sum(value), 3) AS total FROM C;
DESCRIBE C;
