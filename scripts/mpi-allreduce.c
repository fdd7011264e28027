/* MPI_Allreduce timing loop (float sum) in nccl-tests' columns, the Open MPI
 * baseline of scripts/coll-vs-mpi.sh.
 * Usage: mpi-allreduce MINBYTES MAXBYTES FACTOR WARMUP ITERS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long lo = argc > 1 ? atol(argv[1]) : 8, hi = argc > 2 ? atol(argv[2]) : 1 << 20;
    long factor = argc > 3 ? atol(argv[3]) : 2;
    int warmup = argc > 4 ? atoi(argv[4]) : 2, iters = argc > 5 ? atoi(argv[5]) : 10;
    if (factor < 2) factor = 2;
    float *buf = malloc(hi > 4 ? hi : 4), *out = malloc(hi > 4 ? hi : 4);
    if (!buf || !out) MPI_Abort(MPI_COMM_WORLD, 1);
    if (rank == 0) {
        printf("# mpi-allreduce: %d ranks, float sum, %d warm-up + %d iterations\n", size, warmup, iters);
        printf("# %10s  %12s  %9s  %7s  %7s  %6s\n", "size", "count", "time", "algbw", "busbw", "#wrong");
        printf("# %10s  %12s  %9s  %7s  %7s  %6s\n", "(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)", "");
    }
    for (long bytes = lo; bytes <= hi; bytes *= factor) {
        long count = bytes / 4;
        for (long i = 0; i < count; i++) buf[i] = (float)((rank * 7 + i * 3) % 4) - 1.5f;
        for (int i = 0; i < warmup; i++) MPI_Allreduce(buf, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) MPI_Allreduce(buf, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double us = (MPI_Wtime() - t0) * 1e6 / iters, maxus;
        MPI_Reduce(&us, &maxus, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        /* Every input is a multiple of 0.5 in [-1.5, 1.5]: sums are exact. */
        long wrong = 0, allwrong;
        for (long i = 0; i < count; i++) {
            float want = 0;
            for (int r = 0; r < size; r++) want += (float)((r * 7 + i * 3) % 4) - 1.5f;
            wrong += out[i] != want;
        }
        MPI_Reduce(&wrong, &allwrong, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            double algbw = bytes / maxus / 1e3, busbw = algbw * 2.0 * (size - 1) / size;
            printf("%12ld  %12ld  %9.1f  %7.3f  %7.3f  %6ld\n", count * 4, count, maxus, algbw, busbw, allwrong);
            fflush(stdout);
        }
    }
    free(buf);
    free(out);
    MPI_Finalize();
    return 0;
}
