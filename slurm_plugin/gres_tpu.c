/*
 * gres/tpu: a Slurm GRES plugin whose one job is to tell the Prolog and Epilog which
 * devices of this GRES the job holds on the node, as SLURM_JOB_TPUS=<idx>,<idx>,...
 * (the indices `scontrol show job -d` prints as IDX:, i.e. the bit positions of the
 * job's allocation in this node's GRES, across all its types).
 *
 * Without a plugin Slurm gives a GRES nothing in the prolog environment, so the
 * slurm-tpu prolog had to ask slurmctld (`scontrol show job -d`) on every job. Slurm
 * builds the prolog/epilog GRES environment only through the GRES plugin of that name:
 *
 *   25.11: slurmd calls gres_p_prep_build_env() on each of the job's GRES records (from
 *          the launch credential) and then gres_p_prep_set_env() for this node;
 *   22.05: the same two calls are named gres_p_epilog_build_env()/_set_env(); with
 *          PrologFlags=Alloc (and for the epilog) slurmctld builds the list, so the
 *          controller must load this plugin too (same PluginDir in slurm.conf).
 *
 * Everything else keeps what Slurm does for a GRES without a plugin: gres.conf File=
 * devices are loaded by Slurm's common code (so ConstrainDevices covers them), and the
 * job's, step's and tasks' own environments are left alone (no *_VISIBLE_DEVICES: the
 * slurm-tpu hooks and the job's runtime decide what a job sees).
 *
 * One source for both releases: #if on SLURM_VERSION_NUMBER picks the symbol set that
 * release's src/common/gres.c (22.05) or src/interfaces/gres.c (25.11) requires; a
 * plugin missing one is refused. GRES_NAME (default "tpu") and GRES_ENV_VAR (default
 * "SLURM_JOB_TPUS") are compile-time so the same file could serve another family.
 * Build: slurm_plugin/build.sh (see slurm_plugin/README.md).
 */

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "slurm/slurm.h"
#include "slurm/slurm_errno.h"

#include "src/common/slurm_xlator.h"
#include "src/common/bitstring.h"
#include "src/common/env.h"
#include "src/common/list.h"
#include "src/common/xstring.h"

/*
 * The two interfaces this file knows (others between them differ in ways not checked
 * here, so they are refused at compile time rather than loaded into a daemon).
 */
#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(25, 11, 0) && \
	SLURM_VERSION_NUMBER < SLURM_VERSION_NUM(25, 12, 0)
#define TPU_SLURM_25 1
#elif SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(22, 5, 0) && \
	SLURM_VERSION_NUMBER < SLURM_VERSION_NUM(22, 6, 0)
#define TPU_SLURM_25 0
#else
#error "gres_tpu.c knows the GRES plugin interfaces of Slurm 22.05 and 25.11 only"
#endif

#if TPU_SLURM_25
#include "src/interfaces/gres.h"
#else
#include "src/common/gres.h"
#endif

#include "src/plugins/gres/common/gres_common.h"

#ifndef GRES_NAME
#define GRES_NAME "tpu"
#endif
#ifndef GRES_ENV_VAR
#define GRES_ENV_VAR "SLURM_JOB_TPUS"
#endif

/* 25.11 names the prolog/epilog record (and its functions) "prep", 22.05 "epilog". */
#if TPU_SLURM_25
typedef gres_prep_t tpu_prep_t;
#define GRES_LIST_T list_t *
#else
typedef gres_epilog_info_t tpu_prep_t;
#define GRES_LIST_T List
#endif

/* Required by Slurm's plugin loader: the type is how gres.c finds "gres/<name>". */
const char plugin_name[] = "Gres " GRES_NAME " plugin (slurm-tpu)";
const char plugin_type[] = "gres/" GRES_NAME;
const uint32_t plugin_version = SLURM_VERSION_NUMBER;

static char gres_name[] = GRES_NAME;

/* This node's gres.conf File= devices of GRES_NAME (slurmd only; NULL in slurmctld). */
static GRES_LIST_T gres_devices = NULL;

extern int init(void)
{
	debug("%s: %s loaded", __func__, plugin_name);
	return SLURM_SUCCESS;
}

#if TPU_SLURM_25
extern void fini(void)
{
	FREE_NULL_LIST(gres_devices);
}
#else
extern int fini(void)
{
	FREE_NULL_LIST(gres_devices);
	return SLURM_SUCCESS;
}
#endif

/*
 * Load this node's gres.conf records of GRES_NAME with Slurm's common code, exactly
 * as Slurm treats a GRES with File= entries: the devices list it builds is what
 * gres_p_get_devices() hands to task/cgroup for ConstrainDevices.
 */
extern int gres_p_node_config_load(GRES_LIST_T gres_conf_list,
				   node_config_load_t *config)
{
	int rc;

	if (gres_devices)
		return SLURM_SUCCESS;
#if TPU_SLURM_25
	rc = gres_node_config_load(gres_conf_list, config, &gres_devices);
#else
	rc = common_node_config_load(gres_conf_list, gres_name, config,
				     &gres_devices);
#endif
	if (rc != SLURM_SUCCESS)
		error("%s: cannot load the %s devices of gres.conf", plugin_type,
		      gres_name);
	return rc;
}

/* The job's, step's and tasks' own environments: left alone (see the top comment). */
extern void gres_p_job_set_env(char ***job_env_ptr, bitstr_t *gres_bit_alloc,
			       uint64_t gres_cnt, gres_internal_flags_t flags)
{
}

extern void gres_p_step_set_env(char ***step_env_ptr, bitstr_t *gres_bit_alloc,
				uint64_t gres_cnt, gres_internal_flags_t flags)
{
}

extern void gres_p_task_set_env(char ***task_env_ptr, bitstr_t *gres_bit_alloc,
				uint64_t gres_cnt, bitstr_t *usable_gres,
				gres_internal_flags_t flags)
{
}

/* slurmd hands the device list to slurmstepd (for its device cgroup) and back. */
extern void gres_p_send_stepd(buf_t *buffer)
{
#if TPU_SLURM_25
	gres_send_stepd(buffer, gres_devices);
#else
	common_send_stepd(buffer, gres_devices);
#endif
}

extern void gres_p_recv_stepd(buf_t *buffer)
{
#if TPU_SLURM_25
	gres_recv_stepd(buffer, &gres_devices);
#else
	common_recv_stepd(buffer, &gres_devices);
#endif
}

#if !TPU_SLURM_25
/* 22.05 only: plugin-specific job/step data; this plugin has none. */
extern int gres_p_get_job_info(gres_job_state_t *gres_js, uint32_t node_inx,
			       enum gres_job_data_type data_type, void *data)
{
	return EINVAL;
}

extern int gres_p_get_step_info(gres_step_state_t *gres_ss, uint32_t node_inx,
				enum gres_step_data_type data_type, void *data)
{
	return EINVAL;
}
#endif

extern GRES_LIST_T gres_p_get_devices(void)
{
	return gres_devices;
}

extern void gres_p_step_hardware_init(bitstr_t *usable_gres, char *settings)
{
}

extern void gres_p_step_hardware_fini(void)
{
}

/*
 * A copy of one of the job's GRES_NAME records (one per type requested:
 * --gres=tpu:usb:1,tpu:pcie:1 gives two), per node, for the prolog/epilog.
 * NULL (nothing to say) when the GRES has no File= devices: then there are no indices.
 */
static tpu_prep_t *_build_env(gres_job_state_t *gres_js)
{
	tpu_prep_t *prep;

	if (!gres_js || !gres_js->gres_bit_alloc || !gres_js->node_cnt)
		return NULL;
	prep = xmalloc(sizeof(*prep));
	prep->node_cnt = gres_js->node_cnt;
	prep->gres_bit_alloc = xcalloc(prep->node_cnt, sizeof(bitstr_t *));
	for (uint32_t i = 0; i < prep->node_cnt; i++) {
		if (gres_js->gres_bit_alloc[i])
			prep->gres_bit_alloc[i] =
				bit_copy(gres_js->gres_bit_alloc[i]);
	}
	return prep;
}

/*
 * Add this node's indices of one record to GRES_ENV_VAR. Slurm starts the prolog
 * environment empty and calls this once per record, so a job with several records
 * (several types) gets all of them: append, never overwrite. Nothing is set when the
 * job holds none of this GRES on this node (the hooks then ask Slurm, as without a plugin).
 */
static void _set_env(char ***env_ptr, tpu_prep_t *prep, int node_inx)
{
	bitstr_t *alloc;
	const char *before;
	char *value = NULL;
	const char *sep = "";
	int64_t first, last;

	if (!env_ptr || !prep || !prep->gres_bit_alloc || node_inx < 0 ||
	    (uint32_t) node_inx >= prep->node_cnt)
		return;
	if (!(alloc = prep->gres_bit_alloc[node_inx]))
		return;
	if ((first = bit_ffs(alloc)) < 0)
		return;
	last = bit_fls(alloc);

	if ((before = getenvp(*env_ptr, GRES_ENV_VAR)) && before[0]) {
		value = xstrdup(before);
		sep = ",";
	}
	for (int64_t idx = first; idx <= last; idx++) {
		if (!bit_test(alloc, idx))
			continue;
		xstrfmtcat(value, "%s%" PRId64, sep, idx);
		sep = ",";
	}
	env_array_overwrite(env_ptr, GRES_ENV_VAR, value);
	xfree(value);
}

#if TPU_SLURM_25
extern gres_prep_t *gres_p_prep_build_env(gres_job_state_t *gres_js)
{
	return _build_env(gres_js);
}

extern void gres_p_prep_set_env(char ***prep_env_ptr, gres_prep_t *gres_prep,
				int node_inx)
{
	_set_env(prep_env_ptr, gres_prep, node_inx);
}
#else
extern gres_epilog_info_t *gres_p_epilog_build_env(gres_job_state_t *gres_js)
{
	return _build_env(gres_js);
}

extern void gres_p_epilog_set_env(char ***epilog_env_ptr,
				  gres_epilog_info_t *gres_ei, int node_inx)
{
	_set_env(epilog_env_ptr, gres_ei, node_inx);
}
#endif
