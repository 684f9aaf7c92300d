/*
 * controller.c - launch control of MuxFlow section 4.2 (preprint eq. 1-2 and the PID
 * controller; journal version section 4.1).
 *
 *   U_GPU = U_SM * a_C                                             (eq. 1)
 *   a_C   = 1 + a_L * (T_SM - C_SM) / T_SM          if C_SM <  T_SM
 *           1 - a_H * (C_SM - T_SM) / (C_H - T_SM)  if C_SM >= T_SM  (eq. 2)
 *
 * Symbols -> control block fields: U_SM u_sm, C_SM c_sm, C_H c_h, T_SM t_sm, a_L a_l,
 * a_H a_h; PID gains kp, ki, kd; the load to hold, target.
 *
 * The paper says xCUDA "delays the kernel when U_GPU is high and launches the kernel when
 * U_GPU is low" and smooths this with a PID controller, without naming the controlled
 * variable. Here the PID output is the minimum interval between two launches of the process,
 * in microseconds: e = U_GPU - target; interval = Kp*e + Ki*integral(e dt) + Kd*de/dt,
 * clamped to [0, max_interval_us]. While U_GPU stays under the target the output reaches 0
 * and launches take the fast path again. The integral term is clamped to the output range
 * [0, max_interval_us] so that it neither winds up nor goes negative. One step per new sample
 * (sample_seq), with dt from the samples' own timestamps, so the controller runs at the rate
 * the executor measures, however often the helper thread polls.
 *
 * Worked example (a_L = 1, a_H = 0.2, T_SM = 1200, C_H = 1600 MHz): C_SM = 900 gives
 * a_C = 1 + 300/1200 = 1.25, so U_SM = 0.8 makes U_GPU = 1.0; C_SM = 1500 gives
 * a_C = 1 - 0.2 * 300/400 = 0.85 and U_GPU = 0.68.
 */
#include <string.h>

#include "xcuda_internal.h"

int xcuda_read_params(const xcuda_control *c, xcuda_params *o) {
    for (int tries = 0; tries < 1000; tries++) {
        uint32_t s1 = LOAD_ACQUIRE(&c->seq);
        if (s1 & 1u) continue;
        o->flags = LOAD_RELAXED(&c->flags);
        o->sample_seq = LOAD_RELAXED(&c->sample_seq);
        o->quota = LOAD_RELAXED(&c->mem_quota_bytes);
        o->sample_time_ns = LOAD_RELAXED(&c->sample_time_ns);
        o->u_sm = load_double(&c->u_sm);
        o->c_sm = load_double(&c->c_sm);
        o->c_h = load_double(&c->c_h);
        o->t_sm = load_double(&c->t_sm);
        o->a_l = load_double(&c->a_l);
        o->a_h = load_double(&c->a_h);
        o->kp = load_double(&c->kp);
        o->ki = load_double(&c->ki);
        o->kd = load_double(&c->kd);
        o->target = load_double(&c->target);
        o->max_interval_us = load_double(&c->max_interval_us);
        o->active_thread_percentage = load_double(&c->active_thread_percentage);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (LOAD_RELAXED(&c->seq) == s1) return 0;
    }
    return -1;
}

double xcuda_clock_factor(const xcuda_params *p) {
    if (p->t_sm <= 0.0) return 1.0;
    if (p->c_sm < p->t_sm) return 1.0 + p->a_l * (p->t_sm - p->c_sm) / p->t_sm;
    if (p->c_h <= p->t_sm) return 1.0;
    return 1.0 - p->a_h * (p->c_sm - p->t_sm) / (p->c_h - p->t_sm);
}

static double clamp_d(double v, double lo, double hi) { return v < lo ? lo : (v > hi ? hi : v); }

double xcuda_pid_step(xcuda_pid *pid, const xcuda_params *p, double u_gpu, double dt_s) {
    double e = u_gpu - p->target;
    double max = p->max_interval_us > 0.0 ? p->max_interval_us : 100000.0;
    if (!pid->primed) {
        pid->primed = 1;
        pid->prev_error = e;
        dt_s = 0.0;
    }
    double deriv = dt_s > 0.0 ? (e - pid->prev_error) / dt_s : 0.0;
    double integral = pid->integral + e * dt_s;
    /* anti-windup: the integral term alone stays within the output range [0, max] */
    if (p->ki > 0.0) integral = clamp_d(integral, 0.0, max / p->ki);
    else integral = 0.0;
    double out = p->kp * e + p->ki * integral + p->kd * deriv;
    pid->integral = integral;
    pid->prev_error = e;
    return clamp_d(out, 0.0, max);
}
