# Shared by the sh hooks (sourced with ".", no fork): find the state directory.
# Mirrors slurm_tpu/hooks/settings.py:scan_state_dir: the config's top-level
# "state_dir:" line (quotes and a trailing comment allowed), default /run/slurm-tpu.
# The defaults here are slurm_tpu/defaults.py's (tests/test_fast_path.py checks they agree).
# A wrong answer only costs speed: the Python side rereads the real config.

slurm_tpu_state_dir() {
    state_dir=/run/slurm-tpu
    _config=${SLURM_TPU_CONFIG:-/etc/slurm-tpu/config.yaml}
    [ -r "$_config" ] || return 0
    while IFS= read -r _line || [ -n "$_line" ]; do
        case $_line in
            state_dir:*)
                _value=${_line#state_dir:}
                _value=${_value%% \#*}
                while :; do case $_value in [[:space:]]*) _value=${_value#?} ;; *) break ;; esac; done
                while :; do case $_value in *[[:space:]]) _value=${_value%?} ;; *) break ;; esac; done
                case $_value in \"*\"|\'*\') _value=${_value#?}; _value=${_value%?} ;; esac
                state_dir=$_value
                return 0 ;;
        esac
    done < "$_config"
}
