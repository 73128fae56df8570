-- A matrix chain: the optimizer picks the association order (and the tiling of each step).
--   tensordb chain.tdb -f sql/matrix_chain.sql

CREATE OR REPLACE TENSOR M1 FROM (SELECT a, b, sin(a + 2.0 * b) AS v FROM range(400) r(a), range(20) s(b))
    INDEX (a, b) VALUE v SHAPE (400, 20);
CREATE OR REPLACE TENSOR M2 FROM (SELECT b, c, cos(b - 0.5 * c) AS v FROM range(20) r(b), range(400) s(c))
    INDEX (b, c) VALUE v SHAPE (20, 400);
CREATE OR REPLACE TENSOR M3 FROM (SELECT c, d, sin(0.1 * c * d) AS v FROM range(400) r(c), range(30) s(d))
    INDEX (c, d) VALUE v SHAPE (400, 30);
CREATE OR REPLACE TENSOR M4 FROM (SELECT d, e, cos(d + e) AS v FROM range(30) r(d), range(300) s(e))
    INDEX (d, e) VALUE v SHAPE (30, 300);

-- (M1 M2) would be a 400 x 400 intermediate; the chosen order avoids it.
EXPLAIN R[a,e] = M1[a,b] * M2[b,c] * M3[c,d] * M4[d,e];
R[a,e] = M1[a,b] * M2[b,c] * M3[c,d] * M4[d,e];

-- the same product in numpy's notation
R2 = EINSUM('ab,bc,cd,de->ae', M1, M2, M3, M4);
SELECT max(abs(r.value - r2.value)) < 1e-6 AS same FROM R r JOIN R2 r2 USING (a, e);
