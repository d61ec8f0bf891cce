"""The slow tests, by measure: each test function whose runs took two seconds or more (all its parameters
together, the test body alone) in a serial run of the whole suite on a busy two-core machine, with those seconds.

``tests/conftest.py`` marks them ``slow`` (``./run.sh quick`` leaves them out) and hands the longest to the
xdist workers first, so that no long test starts last and holds up the end of the run. A test that became fast
may stay here (it only runs earlier); a new slow test may carry ``@pytest.mark.slow`` itself, or be added here.
To measure again: ``pytest -n 0 -p no:randomly --durations=0 --durations-min=2`` and sum each function's
``call`` lines.
"""

from __future__ import annotations

SLOW_TESTS: dict[str, dict[str, int]] = {
    "tests/memory/test_chat_remembers.py": {
        "test_impyard_chat_remembers_across_two_runs": 6,
    },
    "tests/memory/test_edges_more.py": {
        "test_m43_the_focus_keeps_the_last_100_entries": 2,
    },
    "tests/memory/test_engine_scenarios.py": {
        "test_a_long_conversation_stays_within_the_saved_state_bound": 3,
    },
    "tests/memory/test_hostile_memory.py": {
        "test_a_flood_of_memory_requests_ends_that_box_never_the_host": 3,
    },
    "tests/memory/test_keeping.py": {
        "test_a_pleasant_fact_told_amid_small_talk_outlives_the_nights_that_forget_the_small_talk": 2,
    },
    "tests/memory/test_real_boxes.py": {
        "test_two_real_boxes_in_one_guild_writing_at_once_lose_nothing": 8,
    },
    "tests/memory/test_remembers_just_now.py": {
        "test_a_fact_told_two_turns_ago_is_remembered_not_denied": 4,
    },
    "tests/memory/test_rule_law_chat.py": {
        "test_a_german_imp_learns_a_rule_and_a_known_name_is_refused_by_the_host": 3,
    },
    "tests/memory/test_service.py": {
        "test_two_hosts_writing_at_once_lose_nothing_and_both_caches_see_all": 2,
    },
    "tests/memory/test_store_race.py": {
        "test_a_message_deleted_while_a_process_keeps_it_leaves_nothing_whichever_came_first": 11,
        "test_two_processes_writing_one_scope_keep_every_write_and_count_each_once": 9,
    },
    "tests/test_bench.py": {
        "test_the_quick_benchmark_writes_every_scenario": 300,
        "test_the_hosts_and_ledger_scenarios_run_quick": 106,
        "test_a_child_that_exits_before_it_is_ready_is_one_line_naming_it": 11,
    },
    "tests/test_box_backends.py": {
        "test_fork_loop_is_stopped_by_the_pids_limit": 9,
        "test_box_check_passes_on_docker": 9,
        "test_cancelling_the_host_leaves_no_box_behind": 8,
        "test_the_same_scripted_conversation_on_each_backend": 7,
        "test_a_docker_box_can_use_state_a_process_box_wrote_as_root": 6,
        "test_lockdown_observed_from_inside_and_outside": 6,
        "test_memory_hog_is_killed_by_the_memory_limit": 3,
        "test_labelled_orphans_are_removed_at_start": 2,
    },
    "tests/test_box_engine.py": {
        "test_the_attached_box_is_the_container_docker_create_makes": 10,
        "test_a_docker_box_adds_no_process_to_the_host": 5,
        "test_stdio_through_the_engine_is_byte_exact_and_stderr_stays_apart": 3,
    },
    "tests/test_box_mounts.py": {
        "test_the_backend_refuses_a_box_whose_state_overlaps_a_running_boxs": 19,
        "test_a_session_waits_for_the_previous_box_of_its_channel_to_let_go": 5,
        "test_a_running_box_of_another_host_process_is_seen_and_a_dead_ones_claim_is_not": 3,
    },
    "tests/test_box_process.py": {
        "test_a_box_that_never_answers_times_out_and_is_killed": 5,
        "test_a_scripted_conversation": 5,
        "test_box_survives_garbage_on_stdin_and_answers_after": 4,
        "test_box_refuses_everything_before_init": 2,
    },
    "tests/test_box_runtime.py": {
        "test_box_check_fails_when_a_limit_is_really_absent": 21,
        "test_box_check_fails_when_only_the_spare_lacks_a_limit": 6,
        "test_a_box_runs_under_the_runtime_asked_for_and_says_so": 5,
    },
    "tests/test_box_stateroot.py": {
        "test_a_docker_box_mounts_its_name_under_the_enforced_root": 4,
    },
    "tests/test_boximage.py": {
        "test_a_failed_build_leaves_no_temp_dirs": 2,
    },
    "tests/test_channels.py": {
        "test_an_audit_row_names_the_host_process_that_wrote_it": 2,
    },
    "tests/test_chat_app.py": {
        "test_a_long_line_from_a_pipe_reaches_the_model_whole": 17,
        "test_a_message_sent_during_a_turn_is_queued_and_the_stage_shows": 13,
        "test_with_several_imps_chat_asks_which": 12,
        "test_history_shows_this_conversation_and_clear_forgets_it_after_asking": 12,
        "test_arrow_keys_edit_the_line_and_up_recalls_the_last_message": 10,
        "test_logs_go_to_the_file_named_at_the_start_not_to_the_screen": 10,
        "test_a_failed_turn_says_why_in_one_line": 10,
        "test_a_silent_turn_says_so": 9,
        "test_a_long_multi_line_paste_reaches_the_model_whole": 8,
        "test_help_lists_the_commands": 8,
    },
    "tests/test_chat_terminal.py": {
        "test_ctrl_c_gives_the_running_turn_its_deadline": 67,
        "test_chat_end_to_end": 46,
        "test_sigterm_shuts_down_and_leaves_no_box": 31,
        "test_a_second_chat_on_the_same_home_is_refused_with_the_holders_pid": 10,
    },
    "tests/test_cli_output.py": {
        "test_box_check_prints_expected_before_observed": 3,
    },
    "tests/test_cli_tasks.py": {
        "test_a_second_supervise_refuses_with_the_holders_pid": 15,
        "test_supervise_once_runs_what_is_due_and_prints_posts_to_the_terminal": 2,
    },
    "tests/test_conversation.py": {
        "test_typing_shows_from_render_and_stops_when_the_turn_ends": 3,
        "test_a_dm_is_always_respond": 3,
        "test_the_pump_leaves_gates_of_another_surface_alone": 2,
    },
    "tests/test_db_quick.py": {
        "test_the_wal_is_checkpointed_off_the_event_loop": 2,
    },
    "tests/test_departures.py": {
        "test_m103_a_restart_or_a_second_supervisor_queues_nothing_more": 3,
    },
    "tests/test_departures_chat.py": {
        "test_m103_leaving_the_chat_thinks_the_conversation_over_before_it_ends": 10,
        "test_m103_a_long_chat_departs_someone_who_left_elsewhere_30_minutes_ago": 3,
    },
    "tests/test_discord_chat.py": {
        "test_a_gateway_disconnect_mid_turn_still_posts_once": 4,
        "test_images_come_as_data_and_other_files_as_what_they_are": 4,
        "test_another_imp_never_wakes_pip": 3,
        "test_a_thread_is_a_channel_of_its_own": 3,
        "test_a_dm_is_answered_as_respond": 3,
        "test_a_reply_chain_carries_the_replied_to_message": 3,
        "test_reaction_clear_reaches_the_live_box": 2,
        "test_a_forged_system_line_stays_content": 2,
        "test_a_group_is_judged_and_silence_posts_nothing_and_shows_no_typing": 2,
        "test_mention_mode_ambient_is_stored_and_starts_no_box": 2,
    },
    "tests/test_discord_presence.py": {
        "test_seed_003_the_status_clears_once_the_imp_is_idle": 16,
    },
    "tests/test_discord_serve.py": {
        "test_sigterm_stops_serve_cleanly": 3,
        "test_the_plain_reply_path_with_the_docker_backend": 3,
    },
    "tests/test_discord_shards.py": {
        "test_two_hosts_as_two_shards_answer_every_message_exactly_once": 11,
        "test_a_shard_whose_host_is_killed_mid_turn_is_answered_by_its_next_holder": 5,
    },
    "tests/test_faults_burst.py": {
        "test_a_pasted_burst_is_one_turn_and_one_model_call": 3,
        "test_a_paste_the_terminal_did_not_bracket_is_one_model_call_at_the_prompt_too": 3,
        "test_a_burst_past_the_send_limit_pays_for_no_reply_it_cannot_send": 3,
        "test_a_paste_that_ends_in_a_command_does_it_after_the_message": 3,
    },
    "tests/test_gates_store.py": {
        "test_a_gate_approved_and_executed_by_two_processes_executes_once": 7,
    },
    "tests/test_gateway.py": {
        "test_end_to_end_a_real_box_replies_through_the_gateway": 2,
    },
    "tests/test_hostile_docker.py": {
        "test_a_box_swapping_a_dir_for_a_symlink_never_gets_host_files_chowned": 22,
        "test_a_box_filling_its_state_dir_past_the_quota_is_killed_and_not_restarted": 10,
        "test_one_file_can_never_outgrow_the_quota": 5,
    },
    "tests/test_hostile_fetch.py": {
        "test_html_past_the_size_bound_is_cut_and_says_truncated": 2,
    },
    "tests/test_hosts.py": {
        "test_a_second_serve_of_a_shard_is_refused_and_takes_over_once_the_holder_is_killed": 15,
        "test_a_second_chat_of_the_same_channel_is_refused_naming_the_holder_and_hosts_shows_it": 9,
    },
    "tests/test_leases.py": {
        "test_two_processes_racing_for_a_lease_give_it_to_exactly_one": 3,
    },
    "tests/test_ledger.py": {
        "test_racing_processes_never_overspend_an_imps_cap": 17,
    },
    "tests/test_memory_night.py": {
        "test_m114_night_forgets_in_every_scope_now_whatever_the_clock": 2,
    },
    "tests/test_responder_env.py": {
        "test_env_09_a_missing_channel_falls_back_to_the_message_channel": 2,
    },
    "tests/test_responder_gateway.py": {
        "test_web_fetch_goes_through_the_hosts_egress_policy": 3,
    },
    "tests/test_responder_history.py": {
        "test_a_guild_box_is_never_handed_a_dms_lines": 7,
    },
    "tests/test_schedules.py": {
        "test_a_due_fire_raced_by_two_supervisors_is_queued_once": 6,
    },
    "tests/test_sessions.py": {
        "test_a_failed_turn_in_respond_framing_gets_a_notice": 4,
    },
    "tests/test_signals_at_start.py": {
        "test_a_second_sigterm_while_serve_stops_cuts_the_turn_off_and_exits_0": 20,
        "test_serve_stopped_while_its_bot_connects_closes_the_box_it_started": 17,
        "test_a_start_waiting_for_the_database_is_stopped_by_sigterm_and_exits_0": 8,
        "test_serve_stopped_while_its_bot_logs_in_releases_its_lease_and_exits_0": 6,
        "test_a_chat_stopped_while_it_takes_its_lease_never_comes_up_and_exits_0": 4,
    },
    "tests/test_spares.py": {
        "test_a_claimed_spare_gets_its_channels_state_and_hands_it_back": 5,
        "test_a_spare_is_claimed_once_and_never_shared": 5,
    },
    "tests/test_storage_outage.py": {
        "test_a_message_that_arrives_while_the_server_is_down_is_answered_once_when_it_is_back": 4,
        "test_a_write_waits_for_the_server_and_runs_once_it_answers": 3,
    },
    "tests/test_store_schema.py": {
        "test_an_older_home_is_brought_to_version_ten_then_stamped": 2,
    },
    "tests/test_supervisor.py": {
        "test_the_concurrency_cap_holds_with_ten_due_tasks": 6,
        "test_a_scheduled_task_runs_in_a_real_box_and_posts_through_the_gateway": 4,
        "test_orphan_reclaim_after_a_killed_supervisor": 3,
    },
    "tests/test_task_leases.py": {
        "test_host_b_reclaims_a_frozen_host_as_task_once_its_lease_expired_and_a_then_stops_its_box": 22,
        "test_host_b_leaves_a_task_to_live_host_a_and_reclaims_it_once_when_a_is_killed": 11,
        "test_a_run_holds_its_lease_and_once_it_is_taken_over_its_box_stops_and_its_acts_are_refused": 6,
    },
    "tests/test_task_spares.py": {
        "test_a_task_on_a_spare_is_killed_at_its_ceiling": 9,
        "test_a_lost_lease_stops_the_box_of_the_spare_its_run_claimed": 7,
        "test_a_spare_that_dies_as_its_task_claims_it_leaves_the_task_to_a_started_box_once": 7,
        "test_a_task_run_after_a_conversation_is_served_by_the_imps_spare": 6,
        "test_under_docker_a_task_runs_on_the_spare_a_conversation_left": 3,
        "test_a_task_of_an_imp_with_no_spare_starts_its_own_box_and_another_imps_spare_stays": 2,
    },
    "tests/test_task_state_pruning.py": {
        "test_a_finished_tasks_state_goes_after_the_retention_and_not_before": 3,
        "test_running_and_awaiting_approval_are_kept_at_any_age": 2,
    },
    "tests/test_tasks.py": {
        "test_a_queued_task_raced_by_two_supervisors_runs_once": 16,
    },
    "tests/test_two_engines.py": {
        "test_two_hosts_on_two_docker_engines_answer_every_message_once_each_on_its_own_engine": 300,
    },
    "tests/test_wakefulness.py": {
        "test_m104_m107_two_imps_are_ticked_independently": 6,
        "test_m104_m113_a_day_and_a_night_in_real_boxes": 5,
        "test_m106_a_long_silence_seen_late_reflects_before_sleep": 4,
        "test_m104_m107_a_whole_day_through_the_supervisor": 3,
        "test_m104_activity_during_sleep_wakes_the_imp_and_its_night_waits_for_the_next_sleep": 3,
        "test_m107_a_crash_mid_sleep_never_runs_the_night_twice": 2,
    },
}
